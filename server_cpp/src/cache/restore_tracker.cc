#include "cache/restore_tracker.h"

#include <algorithm>

namespace tce {

void RestoreTracker::Begin(const std::string& job, const std::string& peer, int32_t node_rank) {
  MutexLock l(&mu_);
  restores_[job] = Restore{peer, node_rank, clock_->Now()};
}

void RestoreTracker::End(const std::string& job, const std::string& from) {
  {
    MutexLock l(&mu_);
    auto it = restores_.find(job);
    if (it == restores_.end() || (!from.empty() && it->second.peer != from)) return;
    restores_.erase(it);
  }
  ended_.SignalAll();
}

void RestoreTracker::StopWaits() {
  {
    MutexLock l(&mu_);
    stopping_ = true;
  }
  ended_.SignalAll();
}

Status RestoreTracker::WaitFor(const std::string& job, bool* waited, Clock::TimePoint call_deadline) {
  const auto now = clock_->Now();
  if (call_deadline < now + restore_wait_) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(call_deadline - now);
    return Wait(job, std::max(left, std::chrono::milliseconds(0)), waited,
                "the caller's deadline, before ring_restore_wait_ms");
  }
  return Wait(job, restore_wait_, waited);
}

bool RestoreTracker::InProgress(const std::string& job) const {
  MutexLock l(&mu_);
  return restores_.count(job) != 0;
}

Status RestoreTracker::Wait(const std::string& job, std::chrono::milliseconds timeout, bool* waited,
                            const std::string& bound) {
  MutexLock l(&mu_);
  if (waited) *waited = restores_.count(job) != 0;
  if (!restores_.count(job)) return Status::OK();
  const Stopwatch took(clock_);
  const auto deadline = clock_->Now() + timeout;
  while (restores_.count(job) && !stopping_ && clock_->WaitUntil(&ended_, &mu_, deadline)) {
  }
  if (!restores_.count(job)) return Status::OK();
  if (stopping_)
    return Status::Unavailable("the server is stopping: no longer waiting for the ring restore of job " + job);
  const Restore& r = restores_.at(job);
  const auto running = std::chrono::duration_cast<std::chrono::milliseconds>(clock_->Now() - r.since);
  return Status::DeadlineExceeded(
      "waited " + std::to_string(took.Millis().count()) + " ms (" + bound + ") for the ring restore of job " +
      job + ": node " + std::to_string(r.node_rank) + "'s files are still being pulled back from " + r.peer +
      " (running for " + std::to_string(running.count()) + " ms; tce status shows the ring's last error)");
}

}  // namespace tce
