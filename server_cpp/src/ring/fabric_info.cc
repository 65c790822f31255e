#include "ring/fabric_info.h"

#include <rdma/fabric.h>

#include <algorithm>
#include <set>
#include <sstream>
#include <tuple>

#include "ring/fabric_select.h"

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
