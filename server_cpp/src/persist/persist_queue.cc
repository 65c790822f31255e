#include "persist/persist_queue.h"

#include <algorithm>

namespace tce {

PersistQueue::PersistQueue(std::chrono::milliseconds retry_interval, Clock* clock)
    : retry_interval_(retry_interval), clock_(clock) {}

void PersistQueue::Queue(const FileKey& key) {
  MutexLock lock(&mu_);
  items_.push_back(Item{key, false});
  cv_.Signal();
}

std::chrono::milliseconds PersistQueue::RetryLater(const FileKey& key) {
  if (retry_interval_.count() <= 0) return std::chrono::milliseconds(0);
  MutexLock lock(&mu_);
  retry_at_[key] = clock_->Now() + retry_interval_;
  cv_.SignalAll();  // a worker waits for the attempt
  return retry_interval_;
}

void PersistQueue::CancelRetry(const FileKey& key) {
  MutexLock lock(&mu_);
  retry_at_.erase(key);
}

size_t PersistQueue::Queued() const {
  MutexLock lock(&mu_);
  return items_.size();
}

bool PersistQueue::Next(Item* out) {
  MutexLock lock(&mu_);
  while (!stopping_) {
    // Due retries join the queue behind what is already there.
    const auto now = clock_->Now();
    auto next_retry = Clock::TimePoint::max();
    for (auto it = retry_at_.begin(); it != retry_at_.end();) {
      if (it->second > now) {
        next_retry = std::min(next_retry, it->second);
        ++it;
      } else {
        items_.push_back(Item{it->first, true});
        it = retry_at_.erase(it);
      }
    }
    if (!items_.empty()) {
      *out = std::move(items_.front());
      items_.pop_front();
      return true;
    }
    if (next_retry == Clock::TimePoint::max())
      cv_.Wait(&mu_);
    else
      clock_->WaitUntil(&cv_, &mu_, next_retry);
  }
  return false;
}

void PersistQueue::Stop() {
  MutexLock lock(&mu_);
  stopping_ = true;
  cv_.SignalAll();
}

}  // namespace tce
