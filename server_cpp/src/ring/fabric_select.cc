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

#include <rdma/fabric.h>

#include <set>
#include <sstream>
#include <tuple>

namespace tce {
namespace {

std::string Json(const std::string& s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') out += '\\', out += c;
    else if (static_cast<unsigned char>(c) < 0x20) out += ' ';
    else out += c;
  }
  return out + "\"";
}

std::string JsonList(const std::vector<std::string>& v) {
  std::string out = "[";
  for (size_t i = 0; i < v.size(); ++i) out += (i ? ", " : "") + Json(v[i]);
  return out + "]";
}

bool ProviderMatches(const std::string& prov, const std::string& want) {
  if (want.empty()) return true;
  // "tcp" matches "tcp;ofi_rxm": the core provider under a utility one.
  return prov == want || prov.compare(0, want.size() + 1, want + ";") == 0;
}

}  // namespace

bool CarriesTheRing(const fi_info* i) {
  return (i->caps & FI_RMA) && i->ep_attr->type == FI_EP_RDM &&
         std::string(i->fabric_attr->prov_name) != "shm";
}

std::string FabricInfoJson(const std::string& provider, int local_ranks) {
  std::ostringstream out;
  const uint32_t v = fi_version();
  out << "{\"libfabric\": \"" << FI_MAJOR(v) << "." << FI_MINOR(v) << "\", ";
  std::string variable;
  const std::string spec = DeviceSpecFromEnv(&variable);
  out << "\"filter\": {\"variable\": " << Json(variable) << ", \"spec\": " << Json(spec) << "}, ";
  out << "\"provider\": " << Json(provider) << ", ";
  fi_info* all = nullptr;
  int ret = fi_getinfo(FI_VERSION(1, 9), nullptr, nullptr, 0, nullptr, &all);
  std::set<std::tuple<std::string, std::string, std::string>> seen;
  std::vector<std::string> usable;
  out << "\"providers\": [";
  bool first = true;
  for (fi_info* i = ret == 0 ? all : nullptr; i; i = i->next) {
    const std::string prov = i->fabric_attr->prov_name, fab = i->fabric_attr->name, dev = i->domain_attr->name;
    const bool rma = CarriesTheRing(i);
    if (rma && ProviderMatches(prov, provider) &&
        std::find(usable.begin(), usable.end(), dev) == usable.end())
      usable.push_back(dev);
    if (!seen.insert({prov, fab, dev}).second) continue;
    out << (first ? "" : ", ") << "{\"provider\": " << Json(prov) << ", \"fabric\": " << Json(fab)
        << ", \"device\": " << Json(dev) << ", \"ring\": " << (rma ? "true" : "false") << "}";
    first = false;
  }
  out << "], ";
  if (all) fi_freeinfo(all);
  const std::vector<std::string> selected = FilterDevices(usable, ParseDeviceFilter(spec));
  out << "\"devices\": " << JsonList(usable) << ", \"selected\": " << JsonList(selected) << ", ";
  out << "\"local_ranks\": [";
  for (int r = 0; r < local_ranks; ++r)
    out << (r ? ", " : "") << JsonList(DevicesForLocalRank(selected, r, local_ranks));
  out << "]";
  if (ret != 0) out << ", \"error\": " << Json(fi_strerror(-ret));
  out << "}\n";
  return out.str();
}

}  // namespace tce
