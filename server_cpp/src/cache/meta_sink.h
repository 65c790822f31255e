// MetaSink: where the Cache reports every file state change (commit,
// persisted, failed, evicted, removed) and every completed tag. Implementations must not block: the
// Cache calls them with its lock held. Any thread.
#pragma once

#include "cache/cache_types.h"

namespace tce {

class MetaSink {
 public:
  virtual ~MetaSink() = default;
  virtual void Record(const FileInfo& file, bool removed) = 0;
  virtual void RecordTag(const TagInfo& tag) = 0;
  virtual void RecordRing(const RingInfo& ring) = 0;
};

}  // namespace tce
