#include "ring/backup_queue.h"

#include <utility>

namespace tce {

void BackupQueue::Send(const FileKey& key) {
  MutexLock lock(&mu_);
  sends_.push_back(key);
  cv_.Signal();
}

void BackupQueue::SendTag(TagCopy tag) {
  MutexLock lock(&mu_);
  urgent_.push_back(std::move(tag));
  cv_.Signal();
}

void BackupQueue::Drop(DropCopy drop) {
  MutexLock lock(&mu_);
  urgent_.push_back(std::move(drop));
  cv_.Signal();
}

void BackupQueue::Persisted(PersistedCopy copy) {
  MutexLock lock(&mu_);
  urgent_.push_back(std::move(copy));
  cv_.Signal();
}

void BackupQueue::Recover(RecoverJob recover) {
  MutexLock lock(&mu_);
  urgent_.push_back(std::move(recover));
  cv_.Signal();
}

std::vector<FileKey> BackupQueue::Waiting() const {
  MutexLock lock(&mu_);
  return std::vector<FileKey>(sends_.begin(), sends_.end());
}

bool BackupQueue::Next(Job* out) {
  MutexLock lock(&mu_);
  while (!stopping_ && urgent_.empty() && sends_.empty()) cv_.Wait(&mu_);
  if (stopping_) return false;
  if (!urgent_.empty()) {
    *out = std::move(urgent_.front());
    urgent_.pop_front();
  } else {
    *out = std::move(sends_.front());
    sends_.pop_front();
  }
  return true;
}

void BackupQueue::Stop() {
  MutexLock lock(&mu_);
  stopping_ = true;
  cv_.SignalAll();
}

}  // namespace tce
