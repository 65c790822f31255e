// MetaWriter: the Cache's MetaSink. Record() only queues (the data path never
// waits for the database); a thread writes batches, coalescing changes to the
// same file, and when the store fails it keeps the queue, retries with
// backoff and reports the degradation in Status(). Any thread may call.
#pragma once

#include <chrono>
#include <condition_variable>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "cache/meta_sink.h"
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
             std::chrono::milliseconds max_backoff = std::chrono::seconds(30));
  ~MetaWriter() override;
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

  std::unique_ptr<MetaStore> store_;  // used by the thread only
  const std::string endpoint_;
  const int64_t pid_;
  const std::chrono::milliseconds heartbeat_;
  const std::chrono::milliseconds max_backoff_;
  std::mutex mu_;
  std::condition_variable cv_;
  // (job, path) for files; (job, "\0tag:" + tag) for tags (paths are absolute).
  std::map<std::pair<std::string, std::string>, MetaChange> queue_;  // GUARDED_BY(mu_)
  MetaStatus status_;                                               // GUARDED_BY(mu_)
  size_t in_flight_ = 0;  // GUARDED_BY(mu_): changes being written now
  bool stop_ = false;                                               // GUARDED_BY(mu_)
  std::chrono::steady_clock::time_point stop_by_;                  // GUARDED_BY(mu_)
  std::thread thread_;
};

}  // namespace tce
