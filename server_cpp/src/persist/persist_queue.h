// PersistQueue: the files waiting to be written to storage, in commit order,
// and the schedule of files whose persistence failed for a reason that may
// clear (disk full, I/O errors...): each is tried again after the retry
// interval, for as long as the Cache still holds its memory.
//
// The Cache feeds it (PersistFeed); Persister workers take from it (Next) and
// ask the Cache for the file's current version (PersistSource::StartPersist), which
// may say there is nothing to do: a key is only a hint. Files go into lanes
// (one per storage root, or group of roots, as the Persister says), each
// with workers of its own: a root that stops answering holds its own lane's
// workers, never another root's files. Thread-safe.
#pragma once

#include <chrono>
#include <deque>
#include <functional>
#include <map>
#include <vector>

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

  // Which lane a file goes into (< the number of lanes). Called under the
  // queue's lock: it must not call back into the Cache or the queue.
  using LaneOf = std::function<size_t(const FileKey&)>;

  // `retry_interval`: how long after a failure that may clear the file is
  // tried again (<= 0: never by itself), on `clock`. `lanes` lanes (at least
  // one), each file in the one `lane_of` names (null: all in lane 0).
  explicit PersistQueue(std::chrono::milliseconds retry_interval = std::chrono::seconds(30),
                        Clock* clock = Clock::Real(), size_t lanes = 1, LaneOf lane_of = nullptr);

  void Queue(const FileKey& key) override;
  std::chrono::milliseconds RetryLater(const FileKey& key) override;
  void CancelRetry(const FileKey& key) override;
  size_t Queued() const override;

  // Blocks for the next item of `lane`: queued files first come first,
  // scheduled retries once due (after what was queued before them). False
  // once stopped.
  bool Next(Item* out, size_t lane = 0);
  // Wakes every Next() with false, now and later.
  void Stop();
  size_t lanes() const { return lanes_; }

 private:
  size_t LaneOfKey(const FileKey& key) const;

  const std::chrono::milliseconds retry_interval_;
  Clock* const clock_;
  const size_t lanes_;
  const LaneOf lane_of_;
  mutable Mutex mu_;
  CondVar cv_;  // an item was queued, a retry scheduled, or stopping
  std::vector<std::deque<Item>> items_ GUARDED_BY(mu_);  // one per lane
  std::map<FileKey, Clock::TimePoint> retry_at_ GUARDED_BY(mu_);
  bool stopping_ GUARDED_BY(mu_) = false;
};

}  // namespace tce
