// MetaWriter: the Cache's MetaSink. Record() only queues (the data path never
// waits for the database); a thread writes batches, coalescing changes to the
// same file, and when the store fails it keeps the queue, retries with
// backoff and reports the degradation in Status(). Every `check_every` (and
// before each batch) it checks that the database is still the one it opened;
// when it was deleted or replaced it starts a fresh one and asks for the
// full state again (SetResync), unhealthy until that is written. When the
// store says the database is damaged in place (FAILED_PRECONDITION), it
// writes nothing, keeps the queue, and says so in Status() and in an ERROR
// log line (again every kUntrustedLogEvery) until the file is moved away.
// Any thread may call.
#pragma once

#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <thread>

#include "cache/meta_sink.h"
#include "common/clock.h"
#include "common/mutex.h"
#include "meta/meta_store.h"

namespace tce {

struct MetaStatus {
  bool healthy = true;
  uint64_t queued = 0;
  uint64_t written = 0;
  std::string last_error;
};

class MetaWriter final : public MetaSink {
 public:
  // Also records `endpoint`/`pid` in the servers table every `heartbeat`.
  MetaWriter(std::unique_ptr<MetaStore> store, std::string endpoint = "", int64_t pid = 0,
             std::chrono::milliseconds heartbeat = std::chrono::seconds(10),
             std::chrono::milliseconds max_backoff = std::chrono::seconds(30),
             std::chrono::milliseconds check_every = std::chrono::seconds(1),
             Clock* clock = Clock::Real());
  ~MetaWriter() override;
  // Called (on the writer's thread, no lock held) after a fresh database
  // replaced a deleted one: it must Record() every file, tag and ring again.
  // Set before Start.
  void SetResync(std::function<void()> resync) { resync_ = std::move(resync); }
  void Start();
  // Writes what is queued (bounded by `deadline`), then stops the thread.
  void Stop(std::chrono::milliseconds deadline = std::chrono::seconds(5));

  void Record(const FileInfo& file, bool removed) override;
  void RecordTag(const TagInfo& tag) override;
  void RecordRing(const RingInfo& ring) override;
  MetaStatus Status();

 private:
  void Loop();
  void Queue(std::pair<std::string, std::string> key, MetaChange change);
  // Thread only, mu_ not held: a fresh database if the old one is gone.
  // False while there is none to write to (status_ says why).
  bool EnsureIntact();
  // Unhealthy because of `why` (a database damaged in place); logs it when
  // new, and again every kUntrustedLogEvery.
  void ReportUntrusted(const tce::Status& why) REQUIRES(mu_);

  static constexpr std::chrono::minutes kUntrustedLogEvery{1};

  std::unique_ptr<MetaStore> store_;  // used by the thread only
  const std::string endpoint_;
  const int64_t pid_;
  const std::chrono::milliseconds heartbeat_;
  const std::chrono::milliseconds max_backoff_;
  const std::chrono::milliseconds check_every_;
  Clock* const clock_;
  std::function<void()> resync_;  // set before Start
  bool resyncing_ = false;        // thread only: the full state is being written again
  bool untrusted_ = false;        // thread only: the store's database is damaged in place
  Mutex mu_;
  CondVar cv_;
  // (job, path) for files; (job, "\0tag:" + tag) for tags (paths are absolute).
  std::map<std::pair<std::string, std::string>, MetaChange> queue_ GUARDED_BY(mu_);
  MetaStatus status_ GUARDED_BY(mu_);
  size_t in_flight_ GUARDED_BY(mu_) = 0;  // changes being written now
  Clock::TimePoint next_untrusted_log_ GUARDED_BY(mu_);
  bool stop_ GUARDED_BY(mu_) = false;
  Clock::TimePoint stop_by_ GUARDED_BY(mu_);
  std::thread thread_;
};

}  // namespace tce
