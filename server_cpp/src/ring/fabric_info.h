// What libfabric offers on this node, for the ofi transport's choice of
// device and for `tce doctor` (tce-server --fabric-info). Needs libfabric:
// built only with TCE_WITH_LIBFABRIC (see ring/transport_factory.h).
#pragma once

#include <string>

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
