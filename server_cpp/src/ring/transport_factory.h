// Where the ring's transports come from: NewTransport makes the one a
// server's ring_transport setting names. The ofi transport needs libfabric,
// which is optional at build time (CMake option TCE_WITH_LIBFABRIC, on by
// default); a build without it answers a request for ofi, or for the
// fabric listing, with an error naming the missing library. The only
// #if on that option is in transport_factory.cc. Thread-safe.
#pragma once

#include <memory>
#include <string>

#include "common/status.h"
#include "ring/transport.h"

namespace tce {

// The transport `o.name` names; a clear error naming the choices otherwise,
// saying why the fabric cannot be opened, or that this build lacks it.
Status NewTransport(const TransportOptions& o, std::unique_ptr<Transport>* out);

// What `tce doctor` shows (tce-server --fabric-info), as JSON: see
// FabricInfoJson in ring/fabric_info.h. NOT_SUPPORTED without libfabric.
Status FabricInfo(const std::string& provider, int local_ranks, std::string* json);

}  // namespace tce
