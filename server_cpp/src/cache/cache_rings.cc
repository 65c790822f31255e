// Cache: the files' side of a job's ring membership. The Rings component
// (cache/rings.h) keeps the rings; RingsSide's steps, each under the
// Cache's lock, admit who sets a ring, join one (a restore of an empty
// node, or the job's backups queued to a new successor), and answer for
// the job's owner and its files.
#include "cache/cache.h"

#include "common/logging.h"

namespace tce {

bool Cache::JobUidLocked(const std::string& job, uid_t* uid) const {
  return owners_.Owner(job, uid) || rings_.SetterUid(job, uid);
}

std::string Cache::JoinRing(const JoinedRing& joined) {
  MutexLock lock(&mu_);
  Ring ring;
  const bool changed = rings_.Apply(joined, &ring);
  const std::string& job = joined.job;
  bool empty = true;  // nothing of this job in memory: a fresh or restarted node
  for (const auto& [key, f] : files_) empty = empty && !(key.first == job && f.buffer_id != 0);
  for (const auto& [id, a] : pending_) empty = empty && a.file.job != job;
  if (empty && !ring.successor.empty() && backups_->feeding()) {
    restores_->Begin(job, ring.successor, ring.node_rank);  // loads of the job wait for it
    backups_->Recover(RecoverJob{job, ring.node_rank, ring.successor, ring.Predecessor()});
  }
  TCE_LOG(kInfo, "ring") << "job=" << job << " node " << ring.node_rank << " of " << ring.endpoints.size()
                         << ", successor " << (ring.successor.empty() ? "none" : ring.successor);
  if (changed) {  // back up what is cached already (to the new successor)
    QueueTags(job);
    for (auto& [key, f] : files_) {
      if (key.first != job || f.buffer_id == 0 || f.state == FileState::kEvicted || f.state == FileState::kFailed)
        continue;
      f.backup_holder.clear();
      QueueBackup(key);
    }
  }
  return ring.successor;
}

class Cache::RingsSide : public RingsHost {
 public:
  explicit RingsSide(Cache* cache) : c_(cache) {}

  Status AdmitRingSetter(const std::string& session, const std::string& job, uid_t* uid, gid_t* gid) override {
    MutexLock lock(&c_->mu_);
    Status s = c_->sessions_.Check(session);
    if (!s.ok()) return s;
    if (job.empty()) return Status::InvalidArgument("a ring needs a job");
    s = c_->CheckAccess(session, job, "set the ring of job '" + job + "'", /*claim=*/true);
    if (!s.ok()) return s;
    const SessionTable::Session* who = c_->sessions_.Find(session);
    *uid = who->uid;
    *gid = who->gid;
    return Status::OK();
  }

  std::string JoinRing(const JoinedRing& ring) override { return c_->JoinRing(ring); }

  bool FileOwner(const std::string& job, uid_t* uid) override {
    MutexLock lock(&c_->mu_);
    return c_->owners_.Owner(job, uid);
  }

  bool OwnerOrClaim(const std::string& job, uid_t uid, uid_t* here) override {
    MutexLock lock(&c_->mu_);
    if (c_->JobUidLocked(job, here)) return true;
    c_->RestoreOwner(job, uid);
    return false;
  }

  bool LostFromMemory(const std::string& job, const std::string& path) override {
    MutexLock lock(&c_->mu_);
    auto it = c_->files_.find({job, path});
    return it == c_->files_.end() || (it->second.buffer_id == 0 && it->second.state != FileState::kEvicted &&
                                      it->second.state != FileState::kDiscarded);
  }

  Status CheckRangeRead(const std::string& session, const std::string& job) override {
    MutexLock lock(&c_->mu_);
    Status s = c_->CheckAccess(session, job, "read ranges of job '" + job + "'");
    if (!s.ok()) return s;
    if (!c_->owners_.Visible(c_->sessions_.Find(session)->uid, job))
      return Status::PermissionDenied("job '" + job + "' has no owner on this server: save into it or "
                                      "join its ring before reading ranges of its files");
    return Status::OK();
  }

 private:
  Cache* const c_;
};

std::unique_ptr<RingsHost> Cache::MakeRingsSide() { return std::make_unique<RingsSide>(this); }

}  // namespace tce
