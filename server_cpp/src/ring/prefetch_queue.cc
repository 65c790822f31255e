#include "ring/prefetch_queue.h"

#include <utility>

namespace tce {

bool PrefetchQueue::Same(const PrefetchJob& a, const PrefetchJob& b) {
  return a.job == b.job && a.dir == b.dir && a.paths == b.paths && a.only_if_empty == b.only_if_empty;
}

bool PrefetchQueue::Add(uid_t uid, PrefetchJob p) {
  MutexLock l(&mu_);
  if (stop_ || count_ >= kMax) return false;
  std::deque<PrefetchJob>& mine = queued_[uid];
  auto run = running_.find(uid);
  const bool running = run != running_.end();
  if (mine.size() + (running ? 1 : 0) >= kPerUid || (running && Same(*run->second, p))) {
    if (mine.empty()) queued_.erase(uid);
    return false;
  }
  for (const PrefetchJob& q : mine)
    if (Same(q, p)) return false;
  if (mine.empty() && !running) turns_.push_back(uid);
  mine.push_back(std::move(p));
  ++count_;
  cv_.Signal();
  return true;
}

bool PrefetchQueue::Take(uid_t* uid, PrefetchJob* p) {
  MutexLock l(&mu_);
  while (!stop_ && turns_.empty()) cv_.Wait(&mu_);
  if (stop_) return false;
  *uid = turns_.front();
  turns_.pop_front();
  std::deque<PrefetchJob>& mine = queued_[*uid];
  *p = std::move(mine.front());
  mine.pop_front();
  running_[*uid] = p;  // what Add compares a new one with
  if (mine.empty()) queued_.erase(*uid);
  return true;
}

void PrefetchQueue::Done(uid_t uid, PrefetchJob* p, bool finished) {
  MutexLock l(&mu_);
  running_.erase(uid);
  if (finished) {
    --count_;
  } else {
    queued_[uid].push_front(std::move(*p));
  }
  auto mine = queued_.find(uid);
  if (mine != queued_.end() && !mine->second.empty()) {
    turns_.push_back(uid);
    cv_.Signal();
  }
}

void PrefetchQueue::Stop() {
  MutexLock l(&mu_);
  stop_ = true;
  cv_.SignalAll();
}

bool PrefetchQueue::stopped() {
  MutexLock l(&mu_);
  return stop_;
}

}  // namespace tce
