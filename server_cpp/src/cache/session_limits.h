// SessionLimits: what the daemon's settings bound per session and per uid
// in the Cache and its components (Sessions, the Publication;
// daemon/limits.cc builds it from the settings).
#pragma once

#include <chrono>
#include <cstddef>

#include "cache/metadata_quota.h"
#include "cache/read_grants.h"

namespace tce {

// Per-session authorization and limits (set before serving).
struct SessionLimits {
  bool root_is_admin = true;           // uid 0 may act on every user's jobs
  size_t max_leases_per_session = 4096;  // Lookup(lease) beyond it: RESOURCE_EXHAUSTED
  // Version leases (AcquireVersion): their length when the reader names
  // none, and the longest one granted.
  std::chrono::milliseconds version_lease{std::chrono::seconds(300)};
  std::chrono::milliseconds version_lease_max{std::chrono::seconds(3600)};
  ReadGrants::Ids read_grants;  // readers of every job's published versions
  MetadataLimits metadata;      // tags, job names, grants and version leases
};

}  // namespace tce
