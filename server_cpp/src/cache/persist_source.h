// PersistSource: the cache as persistence (persist/persister.h) sees it.
//
// The cache queues each committed file's key on the PersistFeed it is built
// with (CacheOptions::persist_feed);
// a worker that takes a key asks here for the file's current version
// (StartPersist: the buffer stays pinned), writes it, checks before the
// rename that it is still current, and reports the outcome (FinishPersist).
// The Cache's Persistence (cache/persistence.h) is one. Thread-safe: the persistence workers call it at once.
#pragma once

#include <chrono>
#include <string>
#include <vector>

#include "cache/cache_types.h"
#include "cache/persist_feed.h"
#include "cache/record.h"
#include "common/status.h"
#include "env/env.h"
#include "storage/object_owner.h"

namespace tce {

class PersistSource {
 public:
  virtual ~PersistSource() = default;
  // The current version of `key` to write, pinned, in `out`; false when
  // there is nothing to do (removed, persisted or being written, or, for a
  // scheduled `retry`, no longer FAILED with its memory), or after
  // StopPersistence.
  virtual bool StartPersist(const FileKey& key, bool retry, PersistJob* out) = 0;
  // Whether the job's version is still the file's current version.
  virtual bool IsCurrent(const PersistJob& job) = 0;
  // Waits (at most `max`) until no save is being written into the cache (an
  // allocation pending, or its buffer being made), so background persistence
  // and the pool's filler never compete with a training rank's copy. Returns
  // how long it waited. PoolBudget's too.
  virtual std::chrono::milliseconds WaitForNoSaves(std::chrono::milliseconds max) = 0;
  // Records the outcome (records carry the CRCs) and unpins the buffer. A
  // file whose persistence failed for a reason that can clear by itself
  // (RESOURCE_EXHAUSTED: disk full, quota, out of descriptors or memory;
  // INTERNAL: I/O errors; UNAVAILABLE, DEADLINE_EXCEEDED) is FAILED with the
  // reason and persisted again after the feed's retry interval, for as long
  // as it stays in memory; other failures (permissions, confinement, a bad
  // record table) stay FAILED until a client retries or removes the file.
  // CANCELLED (the path was removed or replaced on storage since the save)
  // DISCARDS the file. `written`: the file the persister left at the path.
  virtual void FinishPersist(const PersistJob& job, const Status& result, std::vector<Record> records,
                             const FileStat& written) = 0;
  // Persistence stops for good: StartPersist answers false from now on, and
  // whatever waits for persistence (Wait, an allocation waiting for room,
  // WaitForNoSaves) stops waiting.
  virtual void StopPersistence() = 0;
  // Retention on storage (persist/storage_retention.h): the job's complete
  // tags, oldest first; forgetting one whose files were deleted.
  virtual std::vector<TagInfo> ListTags(const std::string& job) = 0;
  virtual void ForgetTag(const std::string& job, const std::string& tag) = 0;
  // Whom retention's deletes of the job's objects are for: the job's owner
  // (storage/object_owner.h), so a tag never deletes another uid's object.
  virtual Requester JobRequester(const std::string& job) = 0;
};

}  // namespace tce
