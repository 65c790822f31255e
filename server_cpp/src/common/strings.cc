#include "common/strings.h"

#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstdlib>

namespace tce {

bool ParseSize(const std::string& text, uint64_t* bytes) {
  if (text.empty()) return false;
  const char* begin = text.c_str();
  char* end = nullptr;
  double value = std::strtod(begin, &end);
  if (end == begin || !std::isfinite(value) || value < 0) return false;
  std::string unit(end);
  for (auto& c : unit) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  while (!unit.empty() && unit.front() == ' ') unit.erase(unit.begin());
  double mult;
  if (unit.empty() || unit == "b") mult = 1;
  else if (unit == "k" || unit == "kib") mult = 1024.0;
  else if (unit == "m" || unit == "mib") mult = 1024.0 * 1024;
  else if (unit == "g" || unit == "gib") mult = 1024.0 * 1024 * 1024;
  else if (unit == "t" || unit == "tib") mult = 1024.0 * 1024 * 1024 * 1024;
  else if (unit == "kb") mult = 1e3;
  else if (unit == "mb") mult = 1e6;
  else if (unit == "gb") mult = 1e9;
  else if (unit == "tb") mult = 1e12;
  else return false;
  double total = value * mult;
  if (total >= 1.8e19) return false;
  *bytes = static_cast<uint64_t>(total);
  return true;
}

std::string HumanBytes(uint64_t bytes) {
  static const char* const kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
  double v = static_cast<double>(bytes);
  int u = 0;
  while (v >= 1024 && u < 5) {
    v /= 1024;
    ++u;
  }
  char buf[32];
  if (u == 0) snprintf(buf, sizeof(buf), "%llu B", static_cast<unsigned long long>(bytes));
  else snprintf(buf, sizeof(buf), "%.1f %s", v, kUnits[u]);
  return buf;
}

namespace {
bool HasControl(const std::string& s) {
  for (unsigned char c : s)
    if (c < 0x20 || c == 0x7f) return true;
  return false;
}
}  // namespace

Status ValidatePath(const std::string& path) {
  if (path.empty()) return Status::InvalidArgument("path is empty");
  if (path.size() > 4096) return Status::InvalidArgument("path is longer than 4096 bytes");
  if (HasControl(path))
    return Status::InvalidArgument("path contains NUL or control characters");
  if (path[0] != '/') return Status::InvalidArgument("path must be absolute: " + path);
  if (path.size() > 1 && path.back() == '/')
    return Status::InvalidArgument("path has a trailing '/': " + path);
  size_t start = 1;
  while (start <= path.size()) {
    size_t end = path.find('/', start);
    if (end == std::string::npos) end = path.size();
    std::string part = path.substr(start, end - start);
    if (part.empty()) return Status::InvalidArgument("path has an empty component: " + path);
    if (part == "." || part == "..")
      return Status::InvalidArgument("path has a '" + part + "' component: " + path);
    start = end + 1;
  }
  return Status::OK();
}

Status ValidateName(const std::string& what, const std::string& value, bool allow_empty,
                    bool allow_slash) {
  if (value.empty() && !allow_empty) return Status::InvalidArgument(what + " is empty");
  if (value.size() > 255) return Status::InvalidArgument(what + " is longer than 255 bytes");
  if (HasControl(value)) return Status::InvalidArgument(what + " contains control characters");
  if (!allow_slash && value.find('/') != std::string::npos)
    return Status::InvalidArgument(what + " contains '/': " + value);
  return Status::OK();
}

}  // namespace tce
