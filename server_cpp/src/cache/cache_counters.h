// CacheCounters: what the Cache has done since the server started, as
// Stats() reports it (tce status, the metrics). Plain data, kept under the
// Cache's lock.
#pragma once

#include <cstdint>

namespace tce {

struct CacheCounters {
  uint64_t buffers_created = 0, buffers_reused = 0;
  uint64_t evicted_files = 0;
  uint64_t discarded_files = 0, stale_drops = 0;  // coherence with storage
  uint64_t fetched_objects = 0, fetched_bytes = 0, marker_rounds = 0;  // object roots
  uint64_t versions_published = 0;     // complete tags recorded, followed versions learned
};

}  // namespace tce
