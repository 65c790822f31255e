// PersistQueue: the files waiting to be written to storage, in commit order,
// and the schedule of files whose persistence failed for a reason that may
// clear (disk full, I/O errors...): each is tried again after the retry
// interval, for as long as the Cache still holds its memory.
//
// The Cache feeds it (PersistFeed); Persister workers take from it (Next) and
// ask the Cache for the file's current version (PersistSource::StartPersist), which
// may say there is nothing to do: a key is only a hint. Thread-safe.
#pragma once

#include <chrono>
#include <deque>
#include <map>

#include "cache/persist_feed.h"
#include "common/clock.h"
#include "common/mutex.h"

namespace tce {

class PersistQueue : public PersistFeed {
 public:
  struct Item {
    FileKey key;
    bool retry = false;  // a scheduled attempt at a FAILED file
  };

  // `retry_interval`: how long after a failure that may clear the file is
  // tried again (<= 0: never by itself), on `clock`.
  explicit PersistQueue(std::chrono::milliseconds retry_interval = std::chrono::seconds(30),
                        Clock* clock = Clock::Real());

  void Queue(const FileKey& key) override;
  std::chrono::milliseconds RetryLater(const FileKey& key) override;
  void CancelRetry(const FileKey& key) override;
  size_t Queued() const override;

  // Blocks for the next item: queued files first come first, scheduled
  // retries once due (after what was queued before them). False once
  // stopped.
  bool Next(Item* out);
  // Wakes every Next() with false, now and later.
  void Stop();

 private:
  const std::chrono::milliseconds retry_interval_;
  Clock* const clock_;
  mutable Mutex mu_;
  CondVar cv_;  // an item was queued, a retry scheduled, or stopping
  std::deque<Item> items_ GUARDED_BY(mu_);
  std::map<FileKey, Clock::TimePoint> retry_at_ GUARDED_BY(mu_);
  bool stopping_ GUARDED_BY(mu_) = false;
};

}  // namespace tce
