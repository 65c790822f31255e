// LoadS3Credentials: S3 keys from the environment or an AWS shared
// credentials file. No error message holds a value read: a malformed line is
// named by its number only, as it may be half a secret.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <string_view>

#include "storage/s3_client.h"
#include "storage/s3_xml.h"

namespace tce {
namespace {

constexpr size_t kMaxCredentialsFile = 64 << 10;

std::string_view Trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t' || s.front() == '\r')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t' || s.back() == '\r')) s.remove_suffix(1);
  return s;
}

bool HasControl(const std::string& s) {
  return std::any_of(s.begin(), s.end(), [](char c) { return static_cast<unsigned char>(c) < 0x20 || c == 0x7f; });
}

// Complete (an access key and its secret) and fit for an HTTP header.
Status CheckCredentials(const std::string& where, const S3Credentials& c) {
  if (c.access_key.empty() || c.secret_key.empty()) {
    return Status::InvalidArgument(where + " has " + (c.access_key.empty() ? "no access key" : "no secret key"));
  }
  if (HasControl(c.access_key) || HasControl(c.secret_key) || HasControl(c.session_token)) {
    return Status::InvalidArgument(where + " holds a key with control characters");
  }
  return Status::OK();
}

Status FromEnvironment(S3Credentials* out) {
  const char* id = std::getenv("AWS_ACCESS_KEY_ID");
  const char* secret = std::getenv("AWS_SECRET_ACCESS_KEY");
  const char* token = std::getenv("AWS_SESSION_TOKEN");
  if ((id == nullptr || *id == '\0') && (secret == nullptr || *secret == '\0')) {
    return Status::NotFound("no S3 credentials: AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY are not set");
  }
  out->access_key = id != nullptr ? id : "";
  out->secret_key = secret != nullptr ? secret : "";
  out->session_token = token != nullptr ? token : "";
  return CheckCredentials("the environment (AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_SESSION_TOKEN)", *out);
}

Status ReadBounded(const std::string& file, std::string* text) {
  const int fd = ::open(file.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    const int err = errno;
    if (err == ENOENT) return Status::NotFound("S3 credentials file " + file + " does not exist");
    return Status::FromErrno(err, "S3 credentials file " + file);
  }
  text->assign(kMaxCredentialsFile + 1, '\0');
  size_t got = 0;
  Status s;
  while (got < text->size()) {
    const ssize_t r = ::read(fd, &(*text)[got], text->size() - got);
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) s = Status::FromErrno(errno, "S3 credentials file " + file);
    if (r <= 0) break;
    got += static_cast<size_t>(r);
  }
  ::close(fd);
  if (!s.ok()) return s;
  if (got > kMaxCredentialsFile) {
    return Status::InvalidArgument("S3 credentials file " + file + " is over " +
                                   std::to_string(kMaxCredentialsFile >> 10) + " KiB");
  }
  text->resize(got);
  return Status::OK();
}

}  // namespace

Status LoadS3Credentials(const std::string& file, const std::string& profile, S3Credentials* out) {
  *out = S3Credentials();
  Status s;
  if (file.empty()) {
    s = FromEnvironment(out);
    if (!s.ok()) *out = S3Credentials();
    return s;
  }
  std::string text;
  s = ReadBounded(file, &text);
  if (!s.ok()) return s;
  const std::string want = profile.empty() ? "default" : profile;
  const std::string where = "profile [" + Printable(want, 64) + "] of S3 credentials file " + file;
  bool found = false, in_profile = false;
  size_t line_no = 0;
  for (size_t pos = 0; pos <= text.size();) {
    size_t end = text.find('\n', pos);
    if (end == std::string::npos) end = text.size();
    const std::string_view line = Trim(std::string_view(text).substr(pos, end - pos));
    pos = end + 1;
    ++line_no;
    if (line.empty() || line[0] == '#' || line[0] == ';') continue;
    if (line.front() == '[') {
      if (line.back() != ']') {
        return Status::InvalidArgument("line " + std::to_string(line_no) + " of " + file + " is not a [section]");
      }
      std::string_view name = Trim(line.substr(1, line.size() - 2));
      if (name.substr(0, 8) == "profile ") name = Trim(name.substr(8));  // ~/.aws/config's spelling
      in_profile = name == want;
      found |= in_profile;
      continue;
    }
    if (!in_profile) continue;
    const size_t eq = line.find('=');
    if (eq == std::string_view::npos) {
      return Status::InvalidArgument("line " + std::to_string(line_no) + " of " + file + " is not key = value");
    }
    const std::string_view name = Trim(line.substr(0, eq));
    const std::string value(Trim(line.substr(eq + 1)));
    if (name == "aws_access_key_id") {
      out->access_key = value;
    } else if (name == "aws_secret_access_key") {
      out->secret_key = value;
    } else if (name == "aws_session_token") {
      out->session_token = value;
    }
  }
  if (!found) return Status::NotFound(where + ": no such profile");
  s = CheckCredentials(where, *out);
  if (!s.ok()) *out = S3Credentials();
  return s;
}

}  // namespace tce
