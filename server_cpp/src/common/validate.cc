#include "common/validate.h"

#include <algorithm>
#include <cmath>

namespace tce {
namespace {

bool HasControl(const std::string& s) {
  for (unsigned char c : s)
    if (c < 0x20 || c == 0x7f) return true;
  return false;
}

Status Invalid(const std::string& field, const std::string& why) {
  return Status::InvalidArgument(field + ": " + why);
}

}  // namespace

bool IsValidUtf8(const std::string& s) {
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  const size_t n = s.size();
  size_t i = 0;
  while (i < n) {
    const unsigned char c = p[i];
    if (c < 0x80) {
      ++i;
      continue;
    }
    size_t len;
    uint32_t cp;
    if (c >= 0xc2 && c <= 0xdf) {
      len = 2;
      cp = c & 0x1f;
    } else if (c >= 0xe0 && c <= 0xef) {
      len = 3;
      cp = c & 0x0f;
    } else if (c >= 0xf0 && c <= 0xf4) {
      len = 4;
      cp = c & 0x07;
    } else {
      return false;  // a continuation byte, an overlong lead (c0, c1) or past f4
    }
    if (n - i < len) return false;
    for (size_t k = 1; k < len; ++k) {
      if ((p[i + k] & 0xc0) != 0x80) return false;
      cp = (cp << 6) | (p[i + k] & 0x3f);
    }
    if ((len == 3 && cp < 0x800) || (len == 4 && cp < 0x10000)) return false;  // overlong
    if (cp >= 0xd800 && cp <= 0xdfff) return false;                            // surrogate
    if (cp > 0x10ffff) return false;
    i += len;
  }
  return true;
}

Status ValidateText(const std::string& field, const std::string& value, size_t max_bytes,
                    bool allow_empty) {
  if (value.empty() && !allow_empty) return Invalid(field, "is empty");
  if (value.size() > max_bytes)
    return Invalid(field, "is " + std::to_string(value.size()) + " bytes, longer than " +
                              std::to_string(max_bytes));
  if (value.find('\0') != std::string::npos) return Invalid(field, "contains NUL");
  if (!IsValidUtf8(value)) return Invalid(field, "is not valid UTF-8");
  return Status::OK();
}

Status ValidatePath(const std::string& path, const std::string& field) {
  Status s = ValidateText(field, path, kMaxPathBytes, /*allow_empty=*/false);
  if (!s.ok()) return s;
  if (HasControl(path)) return Invalid(field, "contains NUL or control characters");
  if (path[0] != '/') return Invalid(field, "must be absolute: " + path);
  if (path.size() > 1 && path.back() == '/') return Invalid(field, "has a trailing '/': " + path);
  size_t start = 1;
  while (start <= path.size()) {
    size_t end = path.find('/', start);
    if (end == std::string::npos) end = path.size();
    const size_t len = end - start;
    if (len == 0) return Invalid(field, "has an empty component: " + path);
    if (len > kMaxPathComponentBytes)
      return Invalid(field, "has a component of " + std::to_string(len) + " bytes, longer than " +
                                std::to_string(kMaxPathComponentBytes));
    if (path.compare(start, len, ".") == 0 || path.compare(start, len, "..") == 0)
      return Invalid(field, "has a '" + path.substr(start, len) + "' component: " + path);
    start = end + 1;
  }
  return Status::OK();
}

Status ValidateName(const std::string& what, const std::string& value, bool allow_empty,
                    bool allow_slash) {
  Status s = ValidateText(what, value, kMaxNameBytes, allow_empty);
  if (!s.ok()) return s;
  if (HasControl(value)) return Invalid(what, "contains control characters");
  if (!allow_slash && value.find('/') != std::string::npos)
    return Invalid(what, "contains '/': " + value);
  return Status::OK();
}

Status ValidateRank(const std::string& field, int64_t value) {
  if (value < 0 || value >= kMaxWorldSize)
    return Invalid(field, "must be in [0, " + std::to_string(kMaxWorldSize) + "), got " +
                              std::to_string(value));
  return Status::OK();
}

Status WaitTimeoutMs(double timeout_s, int64_t* ms) {
  if (std::isnan(timeout_s)) return Invalid("timeout_s", "is NaN");
  if (timeout_s <= 0 || timeout_s > kMaxWaitTimeoutS) {  // +inf included
    *ms = 0;
    return Status::OK();
  }
  *ms = std::max<int64_t>(1, static_cast<int64_t>(std::ceil(timeout_s * 1000)));
  return Status::OK();
}

}  // namespace tce
