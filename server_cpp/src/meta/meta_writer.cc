#include "meta/meta_writer.h"

#include <vector>

#include "common/logging.h"

namespace tce {

MetaWriter::MetaWriter(std::unique_ptr<MetaStore> store, std::string endpoint, int64_t pid,
                       std::chrono::milliseconds heartbeat, std::chrono::milliseconds max_backoff,
                       std::chrono::milliseconds check_every, Clock* clock)
    : store_(std::move(store)), endpoint_(std::move(endpoint)), pid_(pid), heartbeat_(heartbeat),
      max_backoff_(max_backoff), check_every_(check_every), clock_(clock) {}

MetaWriter::~MetaWriter() { Stop(); }

void MetaWriter::Start() { thread_ = std::thread([this] { Loop(); }); }

void MetaWriter::Stop(std::chrono::milliseconds deadline) {
  {
    MutexLock l(&mu_);
    if (stop_) return;
    stop_ = true;
    stop_by_ = clock_->Now() + deadline;
  }
  cv_.SignalAll();
  if (thread_.joinable()) thread_.join();
}

void MetaWriter::Queue(std::pair<std::string, std::string> key, MetaChange change) {
  MutexLock l(&mu_);
  queue_[std::move(key)] = std::move(change);  // the newest change of a key wins
  status_.queued = queue_.size() + in_flight_;
  cv_.Signal();
}

void MetaWriter::Record(const FileInfo& file, bool removed) {
  if (removed)
    Queue({file.job, file.path}, FileRemoved{file.job, file.path});
  else
    Queue({file.job, file.path}, file);
}

// Tags and rings share the queue under keys no path can take (a leading NUL).
void MetaWriter::RecordTag(const TagInfo& tag) {
  Queue({tag.job, std::string("\0tag:", 5) + tag.tag}, tag);
}

void MetaWriter::RecordRing(const RingInfo& ring) {
  Queue({ring.job, std::string("\0ring:", 6) + ring.self}, ring);
}

MetaStatus MetaWriter::Status() {
  MutexLock l(&mu_);
  return status_;
}

void MetaWriter::ReportUntrusted(const tce::Status& why) {
  const auto now = clock_->Now();
  if (status_.healthy || status_.last_error != why.message() || now >= next_untrusted_log_) {
    TCE_LOG(kError, "meta") << "metadata database untrusted, " << queue_.size() + in_flight_
                            << " change(s) queued: " << why.message();
    next_untrusted_log_ = now + kUntrustedLogEvery;
  }
  status_.healthy = false;
  status_.last_error = why.message();
}

bool MetaWriter::EnsureIntact() {
  tce::Status intact = store_->CheckIntact();
  untrusted_ = intact.code() == tce::Status::Code::kFailedPrecondition;
  if (intact.ok()) return true;
  if (untrusted_) {  // damaged in place: left alone
    MutexLock l(&mu_);
    ReportUntrusted(intact);
    return false;
  }
  {
    MutexLock l(&mu_);
    if (status_.healthy || !resyncing_)
      TCE_LOG(kError, "meta") << "metadata database lost: " << intact.message()
                              << "; writing the full state into a fresh one";
    status_.healthy = false;
    status_.last_error = "metadata database lost (" + intact.message() + "); re-writing the full state";
  }
  tce::Status reset = store_->Reset();
  if (!reset.ok()) {
    MutexLock l(&mu_);
    status_.last_error = "metadata database lost (" + intact.message() + "); a fresh one cannot be opened: " +
                         reset.message();
    TCE_LOG(kError, "meta") << status_.last_error;
    return false;
  }
  resyncing_ = true;
  if (resync_) resync_();  // queues every file, tag and ring again
  return true;
}

void MetaWriter::Loop() {
  auto backoff = std::chrono::milliseconds(100);
  MutexLock l(&mu_);
  auto next_beat = clock_->Now();
  auto next_check = clock_->Now() + check_every_;
  // Sleeps `d`, or less once stopping and past the stop deadline.
  auto back_off = [&](std::chrono::milliseconds d) REQUIRES(mu_) {
    const auto until = clock_->Now() + d;
    while (!(stop_ && clock_->Now() >= stop_by_) && clock_->WaitUntil(&cv_, &mu_, until)) {
    }
  };
  while (true) {
    const auto wake = std::min(next_beat, next_check);
    while (!stop_ && queue_.empty() && clock_->WaitUntil(&cv_, &mu_, wake)) {
    }
    if (stop_ && queue_.empty()) return;  // nothing left to write
    if (clock_->Now() >= next_check || !queue_.empty()) {
      next_check = clock_->Now() + check_every_;
      l.Unlock();
      const bool intact = EnsureIntact();
      l.Lock();
      if (!intact) {
        // Stopping: an untrusted database takes nothing, so no waiting for it.
        if (stop_ && (untrusted_ || clock_->Now() >= stop_by_)) {
          TCE_LOG(kError, "meta") << "stopping with " << queue_.size() << " unwritten change(s)";
          return;
        }
        if (untrusted_) {  // nothing to retry: look again as often as when intact
          back_off(check_every_);
          continue;
        }
        back_off(backoff);
        backoff = std::min(backoff * 2, max_backoff_);
        continue;
      }
    }
    if (!endpoint_.empty() && clock_->Now() >= next_beat) {
      next_beat = clock_->Now() + heartbeat_;
      l.Unlock();
      tce::Status hb = store_->Heartbeat(endpoint_, pid_);
      l.Lock();
      if (!hb.ok()) {
        status_.healthy = false;
        status_.last_error = hb.message();
      } else if (queue_.empty() && !resyncing_) {
        status_.healthy = true;  // reachable, and nothing is waiting to be written
      }
    }
    if (queue_.empty() && !resyncing_) continue;  // (a resync of nothing still commits once)
    std::vector<MetaChange> batch;
    for (auto& [key, change] : queue_) batch.push_back(change);
    std::map<std::pair<std::string, std::string>, MetaChange> taken;
    taken.swap(queue_);
    in_flight_ = taken.size();  // still counted as queued until written
    l.Unlock();
    tce::Status s = store_->Apply(batch);
    l.Lock();
    in_flight_ = 0;
    if (s.ok()) {
      if (!status_.healthy) {
        TCE_LOG(kInfo, "meta") << "metadata store healthy again"
                               << (resyncing_ ? " (the full state is written into the fresh database)" : "");
      }
      resyncing_ = false;
      status_.healthy = true;
      status_.written += batch.size();
      backoff = std::chrono::milliseconds(100);
    } else {
      for (auto& [key, change] : taken) queue_.emplace(key, std::move(change));  // newer wins
      status_.queued = queue_.size();
      if (s.code() == tce::Status::Code::kFailedPrecondition) {
        ReportUntrusted(s);
      } else if (status_.healthy || status_.last_error != s.message()) {
        TCE_LOG(kError, "meta") << "metadata store unavailable, " << queue_.size()
                                << " change(s) queued: " << s.message();
      }
      status_.healthy = false;
      status_.last_error = s.message();
      if (stop_ && clock_->Now() >= stop_by_) {
        TCE_LOG(kError, "meta") << "stopping with " << queue_.size() << " unwritten change(s)";
        return;
      }
      back_off(backoff);
      backoff = std::min(backoff * 2, max_backoff_);
    }
    status_.queued = queue_.size() + in_flight_;
  }
}

}  // namespace tce
