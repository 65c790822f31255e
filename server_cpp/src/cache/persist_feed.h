// PersistFeed: how the Cache hands committed files to persistence.
//
// The Cache says which (job, path) has a version to write and which failed
// for a reason that may clear; persist/persist_queue.h keeps the queue and
// the retry schedule, and its workers ask the Cache for each file's current
// version when they get to it (PersistSource::StartPersist). The cache's
// Persistence (cache/persistence.h) calls these with the Cache's lock held:
// an implementation takes only its own lock and never calls back into the
// Cache. Any thread.
#pragma once

#include <chrono>
#include <cstddef>
#include <string>
#include <utility>

namespace tce {

using FileKey = std::pair<std::string, std::string>;  // (job, path)

class PersistFeed {
 public:
  virtual ~PersistFeed() = default;
  // `key` has a new version to write (or one to write again).
  virtual void Queue(const FileKey& key) = 0;
  // Persisting `key` failed for a reason that may clear by itself: returns
  // how long until it is tried again, or 0 when it is not.
  virtual std::chrono::milliseconds RetryLater(const FileKey& key) = 0;
  // `key` is queued again by other means: no scheduled retry.
  virtual void CancelRetry(const FileKey& key) = 0;
  // Files waiting for a worker (not those being written).
  virtual size_t Queued() const = 0;
};

}  // namespace tce
