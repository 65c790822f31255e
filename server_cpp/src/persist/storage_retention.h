// StorageRetention: `storage_keep_last` for object storage. After a tag is
// recorded complete, the job's tags older than the newest N have their
// files under object roots deleted, the tag's completeness marker
// (`.metadata`, `latest`) first, so a tag half deleted never looks complete;
// then the tag is forgotten. A file a kept tag also names stays, and so does
// an object of another uid than the job's owner (a tag may name any path:
// deletes are made as the owner, storage/object_owner.h). Deletes that fail
// are tried again after the job's next tag. One thread of its own
// (deletes are network calls; CommitTag only queues the job, in the
// RetentionQueue, which the daemon makes before the Cache and hands it as
// its TagFeed, then makes the retention over the Cache's persistence).
#pragma once

#include <condition_variable>
#include <deque>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "cache/persist_source.h"
#include "cache/tag_feed.h"
#include "common/mutex.h"
#include "storage/object_store.h"
#include "storage/storage_roots.h"

namespace tce {


// The jobs that recorded a complete tag since the retention last looked
// (each once, at most kMax of them). Thread-safe.
class RetentionQueue : public TagFeed {
 public:
  static constexpr size_t kMax = 4096;
  // `enabled` false (storage_keep_last 0): nothing is queued.
  explicit RetentionQueue(bool enabled) : enabled_(enabled) {}
  // Called under the cache's lock: queues only.
  void TagComplete(const std::string& job) override EXCLUDES(mu_);
  // The next job, waiting for one; false once Stop was called.
  bool Take(std::string* job) EXCLUDES(mu_);
  void Stop() EXCLUDES(mu_);

 private:
  const bool enabled_;
  Mutex mu_;
  CondVar cv_;
  std::deque<std::string> jobs_ GUARDED_BY(mu_);
  bool stop_ GUARDED_BY(mu_) = false;
};

class StorageRetention {
 public:
  // `queue` (made before the Cache, which feeds it) outlives the retention.
  StorageRetention(PersistSource* cache, RetentionQueue* queue, std::shared_ptr<const StorageRoots> roots,
                   size_t keep_last);
  ~StorageRetention();
  void Start();
  void Stop();
  // Applies retention to `job` now, on the caller's thread (the worker's,
  // and tests').
  void Apply(const std::string& job);

  // The order a tag's files are deleted in: markers first.
  static std::vector<std::string> DeleteOrder(const TagInfo& tag);

 private:
  void Loop();

  PersistSource* const cache_;
  RetentionQueue* const queue_;
  const std::shared_ptr<const StorageRoots> roots_;
  const size_t keep_last_;
  std::thread thread_;
};

}  // namespace tce
