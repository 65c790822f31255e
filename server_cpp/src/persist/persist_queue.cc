#include "persist/persist_queue.h"

#include <algorithm>

namespace tce {

PersistQueue::PersistQueue(std::chrono::milliseconds retry_interval, Clock* clock, size_t lanes, LaneOf lane_of)
    : retry_interval_(retry_interval),
      clock_(clock),
      lanes_(std::max<size_t>(lanes, 1)),
      lane_of_(std::move(lane_of)),
      items_(lanes_) {}

size_t PersistQueue::LaneOfKey(const FileKey& key) const {
  const size_t lane = lane_of_ ? lane_of_(key) : 0;
  return lane < lanes_ ? lane : 0;
}

void PersistQueue::Queue(const FileKey& key) {
  MutexLock lock(&mu_);
  items_[LaneOfKey(key)].push_back(Item{key, false});
  cv_.SignalAll();  // the workers of every lane wait on it
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
  size_t n = 0;
  for (const auto& lane : items_) n += lane.size();
  return n;
}

bool PersistQueue::Next(Item* out, size_t lane) {
  MutexLock lock(&mu_);
  if (lane >= lanes_) return false;
  std::deque<Item>& mine = items_[lane];
  while (!stopping_) {
    // Due retries join their lane's queue behind what is already there.
    const auto now = clock_->Now();
    auto next_retry = Clock::TimePoint::max();
    for (auto it = retry_at_.begin(); it != retry_at_.end();) {
      if (it->second > now) {
        if (LaneOfKey(it->first) == lane) next_retry = std::min(next_retry, it->second);
        ++it;
      } else {
        items_[LaneOfKey(it->first)].push_back(Item{it->first, true});
        it = retry_at_.erase(it);
      }
    }
    if (!mine.empty()) {
      *out = std::move(mine.front());
      mine.pop_front();
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
