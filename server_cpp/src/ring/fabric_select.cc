#include "ring/fabric_select.h"

#include <algorithm>
#include <cstdlib>

namespace tce {

bool DeviceFilter::Matches(const std::string& device) const {
  bool hit = false;
  for (const std::string& n : names) hit |= exact ? device == n : device.compare(0, n.size(), n) == 0;
  return names.empty() ? true : hit != exclude;
}

DeviceFilter ParseDeviceFilter(const std::string& spec) {
  DeviceFilter f;
  std::string s = spec;
  auto trim = [](std::string x) {
    const char* ws = " \t\n";
    x.erase(0, x.find_first_not_of(ws));
    x.erase(x.find_last_not_of(ws) + 1);
    return x;
  };
  s = trim(s);
  if (!s.empty() && s[0] == '^') f.exclude = true, s.erase(0, 1);
  if (!s.empty() && s[0] == '=') f.exact = true, s.erase(0, 1);
  size_t start = 0;
  while (start <= s.size()) {
    size_t comma = s.find(',', start);
    if (comma == std::string::npos) comma = s.size();
    std::string name = trim(s.substr(start, comma - start));
    name = name.substr(0, name.find(':'));  // "mlx5_0:1" -> "mlx5_0"
    if (!name.empty()) f.names.push_back(name);
    start = comma + 1;
  }
  return f;
}

std::string DeviceSpecFromEnv(std::string* variable) {
  for (const char* var : {"TCE_RDMA_DEVICES", "NCCL_IB_HCA"}) {
    const char* v = std::getenv(var);
    if (v && *v) {
      *variable = var;
      return v;
    }
  }
  variable->clear();
  return "";
}

std::vector<std::string> FilterDevices(const std::vector<std::string>& all, const DeviceFilter& f) {
  std::vector<std::string> out;
  for (const std::string& d : all)
    if (f.Matches(d) && std::find(out.begin(), out.end(), d) == out.end()) out.push_back(d);
  return out;
}

std::vector<std::string> DevicesForLocalRank(const std::vector<std::string>& devices, int rank, int ranks) {
  const int n = static_cast<int>(devices.size());
  if (n == 0 || ranks <= 0 || rank < 0) return {};
  if (n < ranks) return {devices[rank % n]};
  const int begin = rank * n / ranks, end = (rank + 1) * n / ranks;
  return std::vector<std::string>(devices.begin() + begin, devices.begin() + end);
}

}  // namespace tce
