#include "storage/s3_journal.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <random>
#include <sstream>

#include "common/logging.h"

namespace tce {
namespace {

constexpr size_t kMaxJournal = 16 << 20;  // a journal larger than this is not read (and is started anew)

// An upload id or key as journaled: one line, no NUL.
bool SafeLine(const std::string& s) {
  if (s.empty() || s.size() > 4096) return false;
  for (char c : s)
    if (c == '\n' || c == '\r' || c == '\0') return false;
  return true;
}

bool SafeWord(const std::string& s) { return SafeLine(s) && s.find(' ') == std::string::npos; }

}  // namespace

std::string UploadJournal::NewToken() {
  std::random_device random;
  static const char kHex[] = "0123456789abcdef";
  std::string out;
  for (int i = 0; i < 4; ++i) {
    const unsigned v = random();
    for (int shift = 0; shift < 16; shift += 4) out += kHex[(v >> shift) & 15];
  }
  return out;
}

namespace {

// The whole file from `from` on (at most kMaxJournal + 1 bytes); false when it cannot be opened.
bool ReadFrom(const std::string& path, size_t from, std::string* out) {
  out->clear();
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
  if (fd < 0) return false;
  char buf[65536];
  ssize_t n;
  off_t at = static_cast<off_t>(from);
  while (out->size() <= kMaxJournal && (n = ::pread(fd, buf, sizeof buf, at)) > 0) {
    out->append(buf, static_cast<size_t>(n));
    at += n;
  }
  ::close(fd);
  return true;
}

bool ParseInt(const std::string& s, int64_t* out) {
  if (s.empty() || s.size() > 18) return false;
  size_t i = s[0] == '-' ? 1 : 0;
  if (i == s.size()) return false;
  int64_t v = 0;
  for (; i < s.size(); ++i) {
    if (s[i] < '0' || s[i] > '9') return false;
    v = v * 10 + (s[i] - '0');
  }
  *out = s[0] == '-' ? -v : v;
  return true;
}

}  // namespace

std::string UploadJournal::UploadLine(const std::string& id, const std::string& key) {
  return "+ " + id + " " + key + "\n";
}

std::string UploadJournal::CreationLine(const Creation& c) {
  return "? " + c.token + " " + std::to_string(c.at_s) + " " + std::to_string(c.slack_s) + " " + c.key + "\n";
}

void UploadJournal::Append(const std::string& text, bool sync) {
  int fd = ::open(path_.c_str(), O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600);
  if (fd < 0) {
    TCE_LOG(kWarning, "s3") << "cannot journal uploads in " << path_ << ": " << std::strerror(errno);
    return;
  }
  ssize_t n = ::write(fd, text.data(), text.size());
  if (n != static_cast<ssize_t>(text.size()) || (sync && ::fdatasync(fd) != 0))
    TCE_LOG(kWarning, "s3") << "journal " << path_ << ": " << std::strerror(errno);
  ::close(fd);
}

std::string UploadJournal::Creating(const std::string& key, int64_t at_s, int64_t slack_s) {
  Creation c{NewToken(), key, at_s, slack_s};
  if (path_.empty()) return c.token;
  if (!SafeLine(key)) {
    TCE_LOG(kWarning, "s3") << "not journaling an upload with an unusual key";
    return c.token;
  }
  MutexLock l(&mu_);
  Append(CreationLine(c), /*sync=*/true);
  return c.token;
}

void UploadJournal::Created(const std::string& token, const std::string& id, const std::string& key) {
  MutexLock l(&mu_);
  created_.insert(id);
  if (path_.empty()) return;
  if (!SafeLine(key) || !SafeWord(id)) {
    TCE_LOG(kWarning, "s3") << "not journaling an upload with an unusual id or key";
    return;
  }
  Append(UploadLine(id, key) + "= " + token + "\n", /*sync=*/true);
}

void UploadJournal::Ended(const std::string& id) {
  if (path_.empty() || !SafeWord(id)) return;
  MutexLock l(&mu_);
  Append("- " + id + "\n", /*sync=*/false);
}

bool UploadJournal::CreatedHere(const std::string& id) {
  MutexLock l(&mu_);
  return created_.count(id) > 0;
}

bool UploadJournal::Read(Open* out) {
  *out = Open();
  if (path_.empty()) return false;
  std::string text;
  {
    MutexLock l(&mu_);
    if (!ReadFrom(path_, 0, &text)) return false;
  }
  if (text.size() > kMaxJournal) {
    TCE_LOG(kWarning, "s3") << "the upload journal " << path_ << " is over " << kMaxJournal
                            << " bytes: not read, started anew";
    out->read_bytes = text.size();
    return false;
  }
  // Whole lines only: a line without its end is what a crash cut off
  // (appends are made under the lock held here), dropped at the rewrite.
  out->read_bytes = text.size();
  const size_t whole = text.rfind('\n') == std::string::npos ? 0 : text.rfind('\n') + 1;
  std::istringstream lines(text.substr(0, whole));
  std::map<std::string, Creation> creations;
  std::string line;
  while (std::getline(lines, line)) {
    if (line.size() < 3 || line[1] != ' ') continue;
    const std::string rest = line.substr(2);
    if (line[0] == '+') {
      const size_t sp = rest.find(' ');
      if (sp != std::string::npos && sp > 0) out->uploads[rest.substr(0, sp)] = rest.substr(sp + 1);
    } else if (line[0] == '-') {
      out->uploads.erase(rest);
    } else if (line[0] == '=') {
      creations.erase(rest);
    } else if (line[0] == '?') {
      std::istringstream words(rest);
      Creation c;
      std::string at, slack;
      if (!(words >> c.token >> at >> slack) || !ParseInt(at, &c.at_s) || !ParseInt(slack, &c.slack_s)) continue;
      words.get();  // the space before the key
      std::getline(words, c.key);
      if (!c.key.empty()) creations[c.token] = c;
    }
  }
  for (auto& [token, c] : creations) out->creations.push_back(std::move(c));
  return true;
}

void UploadJournal::Rewrite(const Open& read, const std::string& keep) {
  if (path_.empty()) return;
  MutexLock l(&mu_);
  std::string since;  // lines this run journaled after the read
  if (read.read_bytes <= kMaxJournal && !ReadFrom(path_, read.read_bytes, &since)) since.clear();
  const std::string text = keep + since;
  const std::string tmp = path_ + ".new";
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0600);
  if (fd < 0) return;
  const bool ok = ::write(fd, text.data(), text.size()) == static_cast<ssize_t>(text.size()) && ::fsync(fd) == 0;
  ::close(fd);
  if (ok) ::rename(tmp.c_str(), path_.c_str());
}

}  // namespace tce
