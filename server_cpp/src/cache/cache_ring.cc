// Cache: the files' side of the ring. The job's ring (the Rings component,
// cache/rings.h) decides what goes to the BackupFeed (ring/backup_queue.h,
// through the Backups component); BackupSide's steps pin the current
// version for a backup worker and record how it went, each under the
// Cache's lock. Joining a ring: cache_rings.cc. Files pulled back from the
// ring: cache_recovery.cc.
#include "cache/cache.h"

#include "common/clock.h"
#include "common/logging.h"

namespace tce {

void Cache::QueueBackup(const FileKey& key) {
  if (!rings_.Successor(key.first).empty()) backups_->Send(key);
}

void Cache::QueueTags(const std::string& job) {
  if (rings_.Successor(job).empty() || !backups_->feeding()) return;
  for (const TagInfo& t : tags_.List(job)) backups_->SendTag(TagCopy{job, t.tag});
}

bool Cache::TagToSend(const TagCopy& copy, TagInfo* tag, std::string* peer, int32_t* node) {
  MutexLock lock(&mu_);
  const Ring* ring = rings_.Find(copy.job);
  if (!ring || ring->successor.empty() || !tags_.Find(copy.job, copy.tag, tag)) return false;
  *peer = ring->successor;
  *node = ring->node_rank;
  return true;
}

void Cache::QueueDrop(const FileInfo& f) { backups_->Drop(f); }

bool Cache::PinForBackup(const FileKey& key, BackupJob* out) {
  MutexLock lock(&mu_);
  auto it = files_.find(key);
  const Ring* ring = rings_.Find(key.first);
  if (it == files_.end() || !ring || ring->successor.empty()) return false;
  const std::string& successor = ring->successor;
  FileInfo& f = it->second;
  if (f.buffer_id == 0 || f.state == FileState::kEvicted || f.state == FileState::kFailed ||
      f.state == FileState::kPending || f.backup_holder == successor)
    return false;  // gone, not in memory, or already held there
  Buf& buf = buffers_[f.buffer_id];
  int fd = -1;
  if (!buf.mem->NewFd(/*writable=*/false, &fd).ok()) return false;
  ++buf.pins;
  *out = BackupJob();
  out->job = f.job;
  out->tag = f.tag;
  out->path = f.path;
  out->rank = f.rank;
  out->peer = successor;
  out->node = ring->node_rank;
  out->version = f.version;
  out->buffer_id = buf.id;
  out->size = f.size;
  out->records = f.records;
  out->disk = f.disk;
  out->fd = fd;
  out->data = nullptr;
  Buffer* mem = buf.mem.get();
  lock.Unlock();  // mapping a new buffer faults it in: not under the lock
  if (!mem->Mapping(&out->data).ok()) out->data = nullptr;
  return true;
}

void Cache::RecordBackup(const BackupJob& job, const Status& result) {
  MutexLock lock(&mu_);
  auto b = buffers_.find(job.buffer_id);
  if (b != buffers_.end()) {
    --b->second.pins;
    MaybeFree(b->second);
  }
  auto it = files_.find({job.job, job.path});
  const bool current = it != files_.end() && it->second.version == job.version &&
                       it->second.buffer_id != 0;
  if (!result.ok()) {
    if (current) backups_->Send({job.job, job.path});  // again, after the worker's backoff
    return;
  }
  if (!current) return;  // superseded or evicted meanwhile; the next version goes too
  it->second.backup_holder = job.peer;
  if (it->second.state == FileState::kCached) it->second.state = FileState::kBackedUp;
  if (!job.disk.written) backups_->TellPersisted(it->second);  // persisted while the copy was on its way
  Note(it->second, false);
}

size_t Cache::ForgetHolder(const std::string& job, const std::string& peer) {
  MutexLock lock(&mu_);
  size_t n = 0;
  for (auto& [key, f] : files_) {
    if (key.first != job || f.backup_holder != peer) continue;
    f.backup_holder.clear();
    if (f.state == FileState::kBackedUp) f.state = FileState::kCached;
    QueueBackup(key);
    ++n;
  }
  if (rings_.Successor(job) == peer) QueueTags(job);
  return n;
}

class Cache::BackupSide : public BackupHost {
 public:
  explicit BackupSide(Cache* cache) : c_(cache) {}
  bool PinForBackup(const FileKey& key, BackupJob* out) override { return c_->PinForBackup(key, out); }
  void RecordBackup(const BackupJob& job, const Status& result) override { c_->RecordBackup(job, result); }
  bool TagToSend(const TagCopy& copy, TagInfo* tag, std::string* peer, int32_t* node) override {
    return c_->TagToSend(copy, tag, peer, node);
  }
  size_t ForgetHolder(const std::string& job, const std::string& peer) override {
    return c_->ForgetHolder(job, peer);
  }

 private:
  Cache* const c_;
};

std::unique_ptr<BackupHost> Cache::MakeBackupSide() { return std::make_unique<BackupSide>(this); }

}  // namespace tce
