#include "persist/storage_retention.h"

#include <algorithm>

#include "common/logging.h"

namespace tce {
void RetentionQueue::TagComplete(const std::string& job) {
  if (!enabled_) return;
  MutexLock l(&mu_);
  if (std::find(jobs_.begin(), jobs_.end(), job) == jobs_.end() && jobs_.size() < kMax) jobs_.push_back(job);
  cv_.Signal();
}

bool RetentionQueue::Take(std::string* job) {
  MutexLock l(&mu_);
  while (jobs_.empty() && !stop_) cv_.Wait(&mu_);
  if (stop_) return false;
  *job = std::move(jobs_.front());
  jobs_.pop_front();
  return true;
}

void RetentionQueue::Stop() {
  {
    MutexLock l(&mu_);
    stop_ = true;
  }
  cv_.SignalAll();
}

StorageRetention::StorageRetention(PersistSource* cache, RetentionQueue* queue,
                                   std::shared_ptr<const StorageRoots> roots, size_t keep_last)
    : cache_(cache), queue_(queue), roots_(std::move(roots)), keep_last_(keep_last) {}

StorageRetention::~StorageRetention() { Stop(); }

void StorageRetention::Start() {
  if (keep_last_ == 0 || !roots_ || roots_->objects().empty() || thread_.joinable()) return;
  thread_ = std::thread([this] { Loop(); });
}

void StorageRetention::Stop() {
  queue_->Stop();
  if (thread_.joinable()) thread_.join();
}

void StorageRetention::Loop() {
  std::string job;
  while (queue_->Take(&job)) Apply(job);
}

std::vector<std::string> StorageRetention::DeleteOrder(const TagInfo& tag) {
  std::vector<std::string> order;
  for (const TagFile& f : tag.files)
    if (IsTagMarker(f.path)) order.push_back(f.path);
  for (const TagFile& f : tag.files)
    if (!IsTagMarker(f.path)) order.push_back(f.path);
  return order;
}

void StorageRetention::Apply(const std::string& job) {
  std::vector<TagInfo> tags = cache_->ListTags(job);  // oldest first
  std::sort(tags.begin(), tags.end(), [](const TagInfo& a, const TagInfo& b) {
    return a.version != b.version ? a.version > b.version : a.complete_unix_ns > b.complete_unix_ns;
  });  // newest first
  if (tags.size() <= keep_last_) return;
  std::set<std::string> kept;
  for (size_t i = 0; i < keep_last_; ++i)
    for (const TagFile& f : tags[i].files) kept.insert(f.path);
  const Requester who = cache_->JobRequester(job);  // a tag deletes none of another uid's objects
  for (size_t i = keep_last_; i < tags.size(); ++i) {
    const TagInfo& tag = tags[i];
    bool all = true, any = false;
    size_t deleted = 0;
    for (const std::string& path : DeleteOrder(tag)) {
      std::string key;
      const ObjectRoot* root = roots_->ObjectRootOf(path, &key);
      if (!root) continue;  // not on object storage
      any = true;
      if (kept.count(path)) continue;  // still a kept tag's
      Status s = root->store->Delete(key, who);
      if (s.code() == Status::Code::kPermissionDenied) {  // not the job's to delete: left as it is
        TCE_LOG(kWarning, "retention") << "left " << root->store->Url(key) << " of job=" << job << " tag=" << tag.tag
                                       << ": " << s.message();
        continue;
      }
      if (!s.ok()) {
        TCE_LOG(kWarning, "retention") << "cannot delete " << root->store->Url(key) << " of job=" << job
                                       << " tag=" << tag.tag << ": " << s.ToString()
                                       << " (tried again after the job's next tag)";
        all = false;
        break;  // the marker went first: the rest waits, the tag already looks incomplete
      }
      ++deleted;
    }
    if (!all || !any) continue;  // (a tag with no objects is not this setting's)
    TCE_LOG(kInfo, "retention") << "deleted tag job=" << job << " tag=" << tag.tag << " (" << deleted
                                << " object(s)) from storage: storage_keep_last=" << keep_last_;
    cache_->ForgetTag(job, tag.tag);
  }
}

}  // namespace tce
