// What the daemon's components are built with, resolved from Options: one
// place from setting to component (the rest of the daemon wires them).
#pragma once

#include <cstdint>
#include <string>

#include "cache/session_limits.h"
#include "cache/memory_limits.h"
#include "common/status.h"
#include "daemon/options.h"
#include "ring/transport_factory.h"

namespace tce {

// The bounds on what clients may hold and make the server remember, from
// `opt`; `memory_budget` is the whole budget (cache and
// backups), which metadata_budget's auto is reckoned beside. `why` says how
// metadata_budget was reached. INVALID_ARGUMENT naming the setting.
Status MakeSessionLimits(const Options& opt, uint64_t memory_budget, const MemoryLimits& limits,
                         SessionLimits* out, std::string* why);

// The ring's transport (ring_transport, ofi_provider, ring_streams, the
// device filter from the environment, the source host of peer_advertise).
TransportOptions MakeTransportOptions(const Options& opt);

}  // namespace tce
