// Persistence: the cache's side of writing committed files to storage
// (docs/architecture.md). It serves the persister's workers and the
// storage retention through PersistSource, queues committed files on the
// PersistFeed it is built with (persist/persist_queue.h), and keeps what is
// persistence's own: the files being written now (one version per file),
// the files and bytes written (by storage root), and the rule of which
// failures may clear and are tried again.
//
// The file table, the buffers and the waits for persistence are the
// Cache's, asked through PersistHost, each host call one step under the
// Cache's lock (a file's checks, its pin and its being marked in flight
// are one step, so an eviction, a revalidation or a second worker never
// falls between them).
//
// Locks: its own `mu_` is a leaf: the Cache calls the methods "for the
// Cache" with its lock held, and Persistence never holds `mu_` while it
// calls the host or the feed. Order: the Cache's lock, then Persistence's,
// then the feed's. Thread-safe.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "cache/cache_types.h"
#include "cache/persist_feed.h"
#include "cache/persist_source.h"
#include "common/mutex.h"
#include "common/status.h"
#include "storage/storage_roots.h"

namespace tce {

// What Persistence asks of the node's cache. Each call takes the cache's
// lock (WaitForNoSaves waits under it); none holds Persistence's lock.
class PersistHost {
 public:
  virtual ~PersistHost() = default;
  // PersistSource::StartPersist as one step: the current version of `key`
  // pinned in `out` and marked in flight (Persistence::TakeOff), or false.
  virtual bool PinCurrent(const FileKey& key, bool retry, PersistJob* out) = 0;
  // PersistSource::IsCurrent.
  virtual bool IsCurrent(const PersistJob& job) = 0;
  // PersistSource::WaitForNoSaves: saves being written into the cache.
  virtual std::chrono::milliseconds WaitForNoSaves(std::chrono::milliseconds max) = 0;
  // PersistSource::FinishPersist as one step: the buffer unpinned, the job
  // landed (Persistence::Land), the outcome recorded on the file.
  virtual void Record(const PersistJob& job, const Status& result, std::vector<Record> records,
                      const FileStat& written) = 0;
  // PersistSource::StopPersistence: whatever waits for persistence stops.
  virtual void StopPersistence() = 0;
  // Retention's questions (PersistSource::ListTags, ForgetTag, JobRequester).
  virtual std::vector<TagInfo> CompleteTags(const std::string& job) = 0;
  virtual void ForgetTag(const std::string& job, const std::string& tag) = 0;
  virtual Requester JobRequester(const std::string& job) = 0;
};

// Persistence's figures for CacheStats.
struct PersistFigures {
  uint64_t files = 0, bytes = 0;  // persisted since start
  std::map<std::string, std::pair<uint64_t, uint64_t>> by_root;  // root -> (files, bytes)
};

class Persistence : public PersistSource {
 public:
  // `feed`: where committed files are queued (null: nowhere, they stay in
  // memory); `storage` names each path's root. All outlive it.
  Persistence(PersistFeed* feed, const StorageRoots* storage, PersistHost* host);
  Persistence(const Persistence&) = delete;
  Persistence& operator=(const Persistence&) = delete;

  // ---- PersistSource (cache/persist_source.h) ----
  bool StartPersist(const FileKey& key, bool retry, PersistJob* out) override;
  bool IsCurrent(const PersistJob& job) override;
  std::chrono::milliseconds WaitForNoSaves(std::chrono::milliseconds max) override;
  void FinishPersist(const PersistJob& job, const Status& result, std::vector<Record> records,
                     const FileStat& written) override;
  void StopPersistence() override;
  std::vector<TagInfo> ListTags(const std::string& job) override;
  void ForgetTag(const std::string& job, const std::string& tag) override;
  Requester JobRequester(const std::string& job) override;

  // ---- for the Cache (with its lock held, or none) ----
  // `key` has a version to write: queued on the feed (with storage roots).
  void Queue(const FileKey& key);
  // `key` is queued again by other means, or let go: no scheduled retry.
  void CancelRetry(const FileKey& key);
  // Persisting `key`, whose memory is still held, failed with `why`: when
  // `why` may clear by itself (RESOURCE_EXHAUSTED, INTERNAL, UNAVAILABLE,
  // DEADLINE_EXCEEDED) and the feed schedules retries, it is tried again
  // later; returns what to add to the file's reason ("" when it is not).
  std::string ScheduleRetry(const FileKey& key, const Status& why);
  // Marks `version` of `key` in flight; false when that version is being
  // written already (a second worker has nothing to do).
  bool TakeOff(const FileKey& key, uint64_t version) EXCLUDES(mu_);
  // The write of `version` of `key` ended (a newer version in flight stays).
  void Land(const FileKey& key, uint64_t version) EXCLUDES(mu_);
  // Whether some version of `key` is being written; that `version` of it.
  bool InFlight(const FileKey& key) const EXCLUDES(mu_);
  bool InFlightAt(const FileKey& key, uint64_t version) const EXCLUDES(mu_);
  // `path` (`bytes`) is on storage now: counted, with its root.
  void CountWritten(const std::string& path, uint64_t bytes) EXCLUDES(mu_);
  // Files queued on the feed or being written (CacheStats::persist_queue).
  size_t Backlog() const EXCLUDES(mu_);
  // Whether any file is queued or being written.
  bool Busy() const EXCLUDES(mu_);
  PersistFigures Figures() const EXCLUDES(mu_);

 private:
  PersistFeed* const feed_;
  const StorageRoots* const storage_;
  PersistHost* const host_;
  mutable Mutex mu_;  // a leaf: see the header comment
  std::map<FileKey, uint64_t> in_flight_ GUARDED_BY(mu_);  // key -> the version being written
  PersistFigures written_ GUARDED_BY(mu_);
};

}  // namespace tce
