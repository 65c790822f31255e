// Cache: the files' side of the ring. The job's ring (RingTable) decides
// what goes to the BackupFeed (ring/backup_queue.h, through the Backups
// component); BackupSide's steps pin the current version for a backup
// worker and record how it went, each under the Cache's lock; peers are
// checked against the ring and the job's uid. Files pulled back from the
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

Status Cache::SetRing(const std::string& session, const std::string& job, int32_t node_rank,
                      std::vector<std::string> endpoints, std::string* successor) {
  MutexLock lock(&mu_);
  Status s = sessions_.Check(session);
  if (!s.ok()) return s;
  if (job.empty()) return Status::InvalidArgument("a ring needs a job");
  s = CheckAccess(session, job, "set the ring of job '" + job + "'", /*claim=*/true);
  if (!s.ok()) return s;
  s = RingTable::Check(job, node_rank, endpoints);
  if (!s.ok()) return s;
  // A ring names this server as one of its nodes, or it is not this
  // server's ring: nobody makes a server another node of a job.
  if (!self_endpoint_.empty() && endpoints.size() > 1 &&
      endpoints[static_cast<size_t>(node_rank)] != self_endpoint_)
    return Status::InvalidArgument("endpoints[" + std::to_string(node_rank) + "] is " +
                                   endpoints[static_cast<size_t>(node_rank)] + ", but this server is " +
                                   self_endpoint_ + ": a ring names each server as its own node");
  if (meta_ && !self_endpoint_.empty()) meta_->RecordRing(RingInfo{job, self_endpoint_, node_rank, endpoints});
  *successor = InstallRing(job, node_rank, std::move(endpoints));
  const SessionTable::Session* who = sessions_.Find(session);
  rings_.SetOwner(job, who->uid, who->gid);
  return Status::OK();
}

void Cache::SetSelfEndpoint(const std::string& endpoint) {
  MutexLock lock(&mu_);
  self_endpoint_ = endpoint;
}

void Cache::RestoreRings(std::vector<RingInfo> rings) {
  MutexLock lock(&mu_);
  for (RingInfo& r : rings) {
    if (!RingTable::Check(r.job, r.node_rank, r.endpoints).ok()) continue;
    TCE_LOG(kInfo, "ring") << "rejoining the ring of job=" << r.job << " recorded in metadata";
    InstallRing(r.job, r.node_rank, std::move(r.endpoints));
  }
}

std::string Cache::InstallRing(const std::string& job, int32_t node_rank, std::vector<std::string> endpoints) {
  const bool changed = rings_.Install(job, node_rank, std::move(endpoints));
  const Ring& ring = *rings_.Find(job);
  bool empty = true;  // nothing of this job in memory: a fresh or restarted node
  for (const auto& [key, f] : files_) empty = empty && !(key.first == job && f.buffer_id != 0);
  for (const auto& [id, a] : pending_) empty = empty && a.file.job != job;
  if (empty && !ring.successor.empty() && backups_->feeding()) {
    restores_->Begin(job, ring.successor, node_rank);  // loads of the job wait for it
    backups_->Recover(RecoverJob{job, node_rank, ring.successor, ring.Predecessor()});
  }
  TCE_LOG(kInfo, "ring") << "job=" << job << " node " << node_rank << " of "
                         << ring.endpoints.size() << ", successor "
                         << (ring.successor.empty() ? "none" : ring.successor);
  const std::string successor = ring.successor;
  if (changed) {  // back up what is cached already (to the new successor)
    QueueTags(job);
    for (auto& [key, f] : files_) {
      if (key.first != job || f.buffer_id == 0 || f.state == FileState::kEvicted ||
          f.state == FileState::kFailed)
        continue;
      f.backup_holder.clear();
      QueueBackup(key);
    }
  }
  return successor;
}

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

Status Cache::CheckRingSender(const std::string& job, int32_t node, const std::string& peer) {
  MutexLock lock(&mu_);
  const Ring* ring = rings_.Find(job);
  if (!ring)
    return Status::PermissionDenied("this server was not told job " + job + "'s ring: it takes copies "
                                    "only from the node the ring names (tell it the ring)");
  if (node < 0 || static_cast<size_t>(node) >= ring->endpoints.size() || node == ring->node_rank)
    return Status::PermissionDenied("node " + std::to_string(node) + " is not another node of job " + job +
                                    "'s ring here");
  if (ring->endpoints[static_cast<size_t>(node)] != peer)
    return Status::PermissionDenied(peer + " is not node " + std::to_string(node) + " of job " + job +
                                    "'s ring here (" + ring->endpoints[static_cast<size_t>(node)] + " is)");
  return Status::OK();
}

bool Cache::JobUid(const std::string& job, uid_t* uid) {
  MutexLock lock(&mu_);
  return JobUidLocked(job, uid);
}

bool Cache::JobUidLocked(const std::string& job, uid_t* uid) const {
  if (owners_.Owner(job, uid)) return true;
  const Ring* ring = rings_.Find(job);
  if (!ring || !ring->has_owner) return false;
  *uid = ring->owner_uid;
  return true;
}

Status Cache::CheckPeerUid(const std::string& job, bool named, uid_t uid, const std::string& peer,
                           const std::string& what, bool claim) {
  if (!named)
    return Status::PermissionDenied(peer + " names no uid for job " + job + ": it may not " + what);
  uid_t here = 0;
  MutexLock lock(&mu_);
  if (!JobUidLocked(job, &here)) {
    if (!claim)
      return Status::PermissionDenied("job " + job + " belongs to no uid here yet: " + peer + " may not " + what);
    RestoreOwner(job, uid);  // the ring's node vouches for its job's uid
    return Status::OK();
  }
  if (here != uid)
    return Status::PermissionDenied("job " + job + " belongs to uid " + std::to_string(here) + " here, and " + peer +
                                    " acts for it as uid " + std::to_string(uid) + ": it may not " + what +
                                    " (a job belongs to one uid on every node of its ring)");
  return Status::OK();
}

std::vector<std::string> Cache::RingPeers(const std::string& job) {
  MutexLock lock(&mu_);
  const Ring* ring = rings_.Find(job);
  return ring ? ring->Peers() : std::vector<std::string>();
}

std::vector<std::string> Cache::RingNodes(const std::string& job) {
  MutexLock lock(&mu_);
  const Ring* ring = rings_.Find(job);
  return ring && ring->endpoints.size() > 1 ? ring->endpoints : std::vector<std::string>();
}

bool Cache::MayBeInRing(const std::string& job, const std::string& path) {
  MutexLock lock(&mu_);
  if (rings_.Successor(job).empty()) return false;
  auto it = files_.find({job, path});
  return it == files_.end() || (it->second.buffer_id == 0 && it->second.state != FileState::kEvicted &&
                                 it->second.state != FileState::kDiscarded);
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

size_t Cache::InMemoryCount(const std::string& job) {
  MutexLock lock(&mu_);
  size_t n = 0;
  for (const auto& [key, f] : files_)
    n += key.first == job && f.buffer_id != 0 && f.state != FileState::kPending;
  return n;
}

Status Cache::StartPeerRead(const std::string& job, const std::string& path, FileInfo* out, int* fd) {
  MutexLock lock(&mu_);
  auto it = files_.find({job, path});
  if (it == files_.end() || it->second.buffer_id == 0 || it->second.state == FileState::kPending ||
      it->second.state == FileState::kEvicted || it->second.state == FileState::kDiscarded)
    return Status::NotFound(path + " is not in this server's memory");
  Buf& buf = buffers_[it->second.buffer_id];
  Status s = buf.mem->NewFd(/*writable=*/false, fd);
  if (!s.ok()) return s;
  ++buf.pins;  // not reused until EndPeerRead
  *out = it->second;
  return Status::OK();
}

void Cache::EndPeerRead(uint64_t buffer_id) {
  MutexLock lock(&mu_);
  auto b = buffers_.find(buffer_id);
  if (b == buffers_.end()) return;
  --b->second.pins;
  MaybeFree(b->second);
}

Status Cache::CheckRangeRead(const std::string& session, const std::string& job) {
  MutexLock lock(&mu_);
  Status s = CheckAccess(session, job, "read ranges of job '" + job + "'");
  if (!s.ok()) return s;
  if (!owners_.Visible(sessions_.Find(session)->uid, job))
    return Status::PermissionDenied("job '" + job + "' has no owner on this server: save into it or "
                                    "join its ring before reading ranges of its files");
  return Status::OK();
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
