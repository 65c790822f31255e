#include "cache/persistence.h"

#include <utility>

namespace tce {

Persistence::Persistence(PersistFeed* feed, const StorageRoots* storage, PersistHost* host)
    : feed_(feed), storage_(storage), host_(host) {}

bool Persistence::StartPersist(const FileKey& key, bool retry, PersistJob* out) {
  return host_->PinCurrent(key, retry, out);
}

bool Persistence::IsCurrent(const PersistJob& job) { return host_->IsCurrent(job); }

std::chrono::milliseconds Persistence::WaitForNoSaves(std::chrono::milliseconds max) {
  return host_->WaitForNoSaves(max);
}

void Persistence::FinishPersist(const PersistJob& job, const Status& result, std::vector<Record> records,
                                const FileStat& written) {
  host_->Record(job, result, std::move(records), written);
}

void Persistence::StopPersistence() { host_->StopPersistence(); }

std::vector<TagInfo> Persistence::ListTags(const std::string& job) { return host_->CompleteTags(job); }

void Persistence::ForgetTag(const std::string& job, const std::string& tag) { host_->ForgetTag(job, tag); }

Requester Persistence::JobRequester(const std::string& job) { return host_->JobRequester(job); }

void Persistence::Queue(const FileKey& key) {
  if (feed_ && !storage_->empty()) feed_->Queue(key);
}

void Persistence::CancelRetry(const FileKey& key) {
  if (feed_) feed_->CancelRetry(key);
}

std::string Persistence::ScheduleRetry(const FileKey& key, const Status& why) {
  const Status::Code c = why.code();
  const bool may_clear = c == Status::Code::kResourceExhausted || c == Status::Code::kInternal ||
                         c == Status::Code::kUnavailable || c == Status::Code::kDeadlineExceeded;
  if (!may_clear || !feed_) return "";
  const std::chrono::milliseconds every = feed_->RetryLater(key);
  if (every.count() <= 0) return "";
  return " (persisted again every " + std::to_string(every.count() / 1000.0).substr(0, 4) + " s while in memory)";
}

bool Persistence::TakeOff(const FileKey& key, uint64_t version) {
  MutexLock lock(&mu_);
  auto [it, fresh] = in_flight_.emplace(key, version);
  if (!fresh && it->second == version) return false;
  it->second = version;
  return true;
}

void Persistence::Land(const FileKey& key, uint64_t version) {
  MutexLock lock(&mu_);
  auto it = in_flight_.find(key);
  if (it != in_flight_.end() && it->second == version) in_flight_.erase(it);
}

bool Persistence::InFlight(const FileKey& key) const {
  MutexLock lock(&mu_);
  return in_flight_.count(key) > 0;
}

bool Persistence::InFlightAt(const FileKey& key, uint64_t version) const {
  MutexLock lock(&mu_);
  auto it = in_flight_.find(key);
  return it != in_flight_.end() && it->second == version;
}

void Persistence::CountWritten(const std::string& path, uint64_t bytes) {
  MutexLock lock(&mu_);
  ++written_.files;
  written_.bytes += bytes;
  std::pair<uint64_t, uint64_t>& by_root = written_.by_root[storage_->RootName(path)];
  ++by_root.first;
  by_root.second += bytes;
}

size_t Persistence::Backlog() const {
  const size_t queued = feed_ ? feed_->Queued() : 0;
  MutexLock lock(&mu_);
  return queued + in_flight_.size();
}

bool Persistence::Busy() const {
  if (feed_ && feed_->Queued() > 0) return true;
  MutexLock lock(&mu_);
  return !in_flight_.empty();
}

PersistFigures Persistence::Figures() const {
  MutexLock lock(&mu_);
  return written_;
}

}  // namespace tce
