#include "ring/backup_queue.h"

#include <utility>

namespace tce {

void BackupQueue::Send(const FileKey& key) {
  std::lock_guard<std::mutex> lock(mu_);
  sends_.push_back(key);
  cv_.notify_one();
}

void BackupQueue::Drop(DropCopy drop) {
  std::lock_guard<std::mutex> lock(mu_);
  urgent_.push_back(std::move(drop));
  cv_.notify_one();
}

void BackupQueue::Recover(RecoverJob recover) {
  std::lock_guard<std::mutex> lock(mu_);
  urgent_.push_back(std::move(recover));
  cv_.notify_one();
}

std::vector<FileKey> BackupQueue::Waiting() const {
  std::lock_guard<std::mutex> lock(mu_);
  return std::vector<FileKey>(sends_.begin(), sends_.end());
}

bool BackupQueue::Next(Job* out) {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [this] { return stopping_ || !urgent_.empty() || !sends_.empty(); });
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
  std::lock_guard<std::mutex> lock(mu_);
  stopping_ = true;
  cv_.notify_all();
}

}  // namespace tce
