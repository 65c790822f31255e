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
