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

}  // namespace tce
