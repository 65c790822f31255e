// Which fabric devices the ring uses, with NCCL_IB_HCA's rules so that a
// cluster configured for NCCL needs nothing more:
//   "mlx5_0,mlx5_1"  devices whose names start with these
//   "=mlx5_0"        exactly these names
//   "^mlx5_2"        all but those starting with these ("^=" : all but exactly)
//   a ":port" suffix on a name is accepted and ignored.
// The spec comes from TCE_RDMA_DEVICES, else NCCL_IB_HCA; without either,
// every device counts, divided among the node's local ranks.
#pragma once

#include <string>
#include <vector>

namespace tce {

struct DeviceFilter {
  bool exclude = false;
  bool exact = false;
  std::vector<std::string> names;  // empty: every device
  bool Matches(const std::string& device) const;
};

DeviceFilter ParseDeviceFilter(const std::string& spec);

// The spec in force and the variable it came from ("" and "" when unset).
std::string DeviceSpecFromEnv(std::string* variable);

// `all` (in order) that pass the filter, without repeats.
std::vector<std::string> FilterDevices(const std::vector<std::string>& all, const DeviceFilter& f);

// The devices local rank `rank` of `ranks` uses: with at least as many
// devices as ranks, its own contiguous slice; with fewer, device rank % n.
std::vector<std::string> DevicesForLocalRank(const std::vector<std::string>& devices, int rank, int ranks);

}  // namespace tce

struct fi_info;

namespace tce {

// Whether a libfabric offering can carry the ring: RMA over a reliable
// (RDM) endpoint, reaching other nodes (shm does not). The server picks its
// device among these, and doctor lists them.
bool CarriesTheRing(const fi_info* info);

// What `tce doctor` shows, as JSON: libfabric's version, every (provider,
// fabric, device) it offers and whether it can carry the ring (RMA over a
// reliable endpoint), the device filter in force, the devices the ring may
// use (of `provider`, "" = any) and the ones each of `local_ranks` would use.
std::string FabricInfoJson(const std::string& provider, int local_ranks);

}  // namespace tce
