#include "meta/row_codec.h"

#include <cstdio>
#include <limits>

#include "common/validate.h"

namespace tce {
namespace {

Status Damaged(const char* column, const std::string& why) {
  return Status::DataLoss(std::string(column) + ": " + why);
}

// The next space- or end-delimited token of [pos, end) as an unsigned
// number; advances pos past one following space.
bool NextUint(const std::string& text, size_t* pos, size_t end, uint64_t* out) {
  size_t stop = text.find(' ', *pos);
  if (stop == std::string::npos || stop > end) stop = end;
  if (!ParseUint64(text.substr(*pos, stop - *pos), out)) return false;
  *pos = stop < end ? stop + 1 : end;
  return true;
}

// "<len>:" at pos -> len, with pos moved past the colon; the length must fit
// in what is left of the text.
bool LengthPrefix(const std::string& text, size_t* pos, size_t* len) {
  size_t colon = text.find(':', *pos);
  uint64_t n;
  if (colon == std::string::npos || !ParseUint64(text.substr(*pos, colon - *pos), &n)) return false;
  if (n > text.size() - colon - 1) return false;
  *len = static_cast<size_t>(n);
  *pos = colon + 1;
  return true;
}

}  // namespace

bool ParseUint64(const std::string& text, uint64_t* out) {
  if (text.empty() || text.size() > 20) return false;
  uint64_t v = 0;
  for (char c : text) {
    if (c < '0' || c > '9') return false;
    const uint64_t d = static_cast<uint64_t>(c - '0');
    if (v > (std::numeric_limits<uint64_t>::max() - d) / 10) return false;
    v = v * 10 + d;
  }
  *out = v;
  return true;
}

bool ParseInt64(const std::string& text, int64_t* out) {
  const bool negative = !text.empty() && text[0] == '-';
  uint64_t magnitude;
  if (!ParseUint64(negative ? text.substr(1) : text, &magnitude)) return false;
  const uint64_t limit = static_cast<uint64_t>(std::numeric_limits<int64_t>::max()) + (negative ? 1 : 0);
  if (magnitude > limit) return false;
  *out = negative ? static_cast<int64_t>(0 - magnitude) : static_cast<int64_t>(magnitude);
  return true;
}

std::string EncodeRecords(const std::vector<Record>& records) {
  std::string out;
  for (const Record& r : records) {  // length-prefixed name: file names may hold any separator
    out += std::to_string(r.name.size()) + ':' + r.name + ' ' + std::to_string(r.header_offset) + ' ' +
           std::to_string(r.data_offset) + ' ' + std::to_string(r.size) + ' ' +
           std::to_string(r.central_offset) + ' ' + std::to_string(r.crc32) + '\n';
  }
  return out;
}

Status DecodeRecords(const std::string& text, std::vector<Record>* out) {
  std::vector<Record> records;
  size_t pos = 0;
  while (pos < text.size()) {
    const std::string at = "record " + std::to_string(records.size());
    size_t len;
    if (!LengthPrefix(text, &pos, &len)) return Damaged("records", at + ": bad name length");
    Record r;
    r.name = text.substr(pos, len);
    pos += len;
    if (pos >= text.size() || text[pos] != ' ') return Damaged("records", at + ": no numbers after the name");
    ++pos;
    const size_t eol = text.find('\n', pos);
    if (eol == std::string::npos) return Damaged("records", at + ": unterminated line");
    uint64_t crc = 0;
    if (!NextUint(text, &pos, eol, &r.header_offset) || !NextUint(text, &pos, eol, &r.data_offset) ||
        !NextUint(text, &pos, eol, &r.size) || !NextUint(text, &pos, eol, &r.central_offset) ||
        !NextUint(text, &pos, eol, &crc) || pos != eol || crc > std::numeric_limits<uint32_t>::max())
      return Damaged("records", at + ": expected five numbers");
    r.crc32 = static_cast<uint32_t>(crc);
    records.push_back(std::move(r));
    pos = eol + 1;
  }
  for (Record& r : records) out->push_back(std::move(r));
  return Status::OK();
}

std::string EncodeTagFiles(const std::vector<TagFile>& files) {
  std::string out;
  for (const TagFile& f : files)  // length-prefixed path: paths may hold any byte but NUL
    out += std::to_string(f.rank) + ' ' + std::to_string(f.size) + ' ' + std::to_string(f.path.size()) +
           ':' + f.path + '\n';
  return out;
}

Status DecodeTagFiles(const std::string& text, std::vector<TagFile>* out) {
  std::vector<TagFile> files;
  size_t pos = 0;
  while (pos < text.size()) {
    const std::string at = "file " + std::to_string(files.size());
    TagFile f;
    uint64_t rank;
    const size_t colon = text.find(':', pos);
    if (colon == std::string::npos) return Damaged("files", at + ": no path");
    if (!NextUint(text, &pos, colon, &rank) || !NextUint(text, &pos, colon, &f.size) ||
        rank >= static_cast<uint64_t>(kMaxWorldSize))
      return Damaged("files", at + ": expected rank and size");
    f.rank = static_cast<int32_t>(rank);
    size_t len;
    if (!LengthPrefix(text, &pos, &len) || pos != colon + 1)
      return Damaged("files", at + ": bad path length");
    if (pos + len >= text.size() || text[pos + len] != '\n')
      return Damaged("files", at + ": the path does not end where its length says");
    f.path = text.substr(pos, len);
    files.push_back(std::move(f));
    pos += len + 1;
  }
  for (TagFile& f : files) out->push_back(std::move(f));
  return Status::OK();
}

std::string EncodeEndpoints(const std::vector<std::string>& endpoints) {
  std::string out;
  for (const std::string& e : endpoints) out += e + "\n";
  return out;
}

Status DecodeEndpoints(const std::string& text, std::vector<std::string>* out) {
  std::vector<std::string> endpoints;
  size_t start = 0, nl;
  while ((nl = text.find('\n', start)) != std::string::npos) {
    endpoints.push_back(text.substr(start, nl - start));
    Status s = ValidateText("endpoints", endpoints.back(), kMaxEndpointBytes, false);
    if (!s.ok()) return Status::DataLoss(s.message());
    start = nl + 1;
  }
  if (start != text.size()) return Damaged("endpoints", "unterminated line");
  for (std::string& e : endpoints) out->push_back(std::move(e));
  return Status::OK();
}

Status CheckFileKeys(const FileInfo& f) {
  Status s = ValidateName("job", f.job, false, true);
  if (s.ok()) s = ValidateName("tag", f.tag, true, false);
  if (s.ok()) s = ValidatePath(f.path);
  return s.ok() ? s : Status::DataLoss(s.message());
}

Status CheckTag(const TagInfo& t) {
  Status s = ValidateName("job", t.job, false, true);
  if (s.ok()) s = ValidateName("tag", t.tag, false, false);
  for (size_t i = 0; s.ok() && i < t.files.size(); ++i)
    s = ValidatePath(t.files[i].path, "files[" + std::to_string(i) + "].path");
  return s.ok() ? s : Status::DataLoss(s.message());
}

std::string Printable(const std::string& s, size_t max) {
  std::string out;
  for (size_t i = 0; i < s.size() && i < max; ++i) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    if (c >= 0x20 && c < 0x7f && c != '\\') {
      out += static_cast<char>(c);
    } else {
      char buf[5];
      std::snprintf(buf, sizeof(buf), "\\x%02x", c);
      out += buf;
    }
  }
  if (s.size() > max) out += "...";
  return out;
}

}  // namespace tce
