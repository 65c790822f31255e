// The bounds the daemon's settings put on what clients may hold and make the
// server remember (cache/cache.h's SessionLimits, cache/metadata_quota.h),
// resolved from Options: one place from setting to component.
#pragma once

#include <cstdint>
#include <string>

#include "cache/cache.h"
#include "cache/memory_limits.h"
#include "common/status.h"
#include "daemon/options.h"

namespace tce {

// SessionLimits from `opt`; `memory_budget` is the whole budget (cache and
// backups), which metadata_budget's auto is reckoned beside. `why` says how
// metadata_budget was reached. INVALID_ARGUMENT naming the setting.
Status MakeSessionLimits(const Options& opt, uint64_t memory_budget, const MemoryLimits& limits,
                         SessionLimits* out, std::string* why);

}  // namespace tce
