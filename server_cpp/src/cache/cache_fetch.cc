// Cache: its side of reading storage into the cache (cache/storage_access.h).
// StorageAccess reads; here are who a read is for, the buffer it fills and
// the PERSISTED file it becomes (StorageSide, each under the Cache's lock).
#include "cache/cache.h"
#include "common/logging.h"

namespace tce {

class Cache::StorageSide : public StorageAccessHost {
 public:
  explicit StorageSide(Cache* cache) : c_(cache) {}

  Status Authorize(const std::string& session, const std::string& job, const std::string& what, bool claim,
                   Caller* out) override {
    MutexLock lock(&c_->mu_);
    Status s = c_->CheckAccess(session, job, what, claim);
    if (!s.ok()) return s;
    const SessionTable::Session* sess = c_->sessions_.Find(session);
    out->uid = sess->uid;
    out->gid = sess->gid;
    out->requester = {sess->uid, c_->owners_.IsAdmin(sess->uid)};
    return Status::OK();
  }

  Status JobOwnerIds(const std::string& job, uid_t* uid, gid_t* gid) override {
    return c_->JobOwnerIds(job, uid, gid);
  }
  Requester JobRequester(const std::string& job) override { return c_->JobRequester(job); }
  Requester RequesterOf(uid_t uid) override { return c_->RequesterOf(uid); }
  bool JobUid(const std::string& job, uid_t* uid) override { return c_->rings_.JobUid(job, uid); }

  bool InMemory(const std::string& job, const std::string& path) override {
    MutexLock lock(&c_->mu_);
    auto f = c_->files_.find({job, path});
    return f != c_->files_.end() && f->second.buffer_id != 0;
  }

  Status ReserveBuffer(uint64_t size, std::unique_ptr<Buffer>* out) override {
    return c_->ReserveRecovery(size, out);
  }
  void ReturnBuffer(std::unique_ptr<Buffer> mem) override { c_->AbandonRecovery(std::move(mem)); }

  Status InstallFetched(const std::string& job, const std::string& path, std::unique_ptr<Buffer> mem,
                        uint64_t size, uid_t uid, gid_t gid, DiskIdentity disk, const std::string& from,
                        double secs) override {
    return c_->InstallFetched(job, path, std::move(mem), size, uid, gid, std::move(disk), from, secs);
  }

 private:
  Cache* const c_;
};

std::unique_ptr<StorageAccessHost> Cache::MakeStorageSide() { return std::make_unique<StorageSide>(this); }

Status Cache::JobOwnerIds(const std::string& job, uid_t* uid, gid_t* gid) {
  MutexLock lock(&mu_);
  return JobOwnerIdsLocked(job, uid, gid);
}

Status Cache::JobOwnerIdsLocked(const std::string& job, uid_t* uid, gid_t* gid) const {
  // As the job's owner, never as whoever set the ring (root, for a user's
  // job): the kernel checks the owner's rights, as its own ranks' reads.
  const Ring* ring = rings_.Find(job);
  if (!ring || !ring->has_owner)
    return Status::NotFound("job " + job + " has no ring set here by its user: nothing is read from storage for it");
  gid_t group = JobOwners::kNoGid;
  if (!owners_.Owner(job, uid, &group)) {  // SetRing claims the job: not seen
    *uid = ring->owner_uid;
    group = ring->owner_gid;
  } else if (group == JobOwners::kNoGid && ring->owner_uid == *uid) {
    group = ring->owner_gid;
  }
  if (group == JobOwners::kNoGid)
    return Status::PermissionDenied("job " + job + " belongs to uid " + std::to_string(*uid) +
                                    ", whose group this server does not know (no session of it here): nothing "
                                    "is read from storage for it");
  *gid = group;
  return Status::OK();
}

Status Cache::InstallFetched(const std::string& job, const std::string& path, std::unique_ptr<Buffer> mem,
                             uint64_t size, uid_t uid, gid_t gid, DiskIdentity disk, const std::string& from,
                             double secs) {
  MutexLock lock(&mu_);
  reserved_ -= mem->capacity();
  const FileKey fk{job, path};
  auto it = files_.find(fk);
  if (it != files_.end() && it->second.buffer_id != 0) {  // saved or fetched meanwhile: that one stays
    lock.Unlock();
    std::unique_ptr<Buffer> unused = std::move(mem);
    return Status::FailedPrecondition(path + " reached the cache meanwhile");
  }
  Buf& buf = Install(std::move(mem));
  buf.state = BufState::kCached;
  buf.uid = uid;
  FileInfo f;
  f.job = job;
  f.path = path;
  f.size = size;
  f.owner_uid = uid;
  f.owner_gid = gid;
  f.buffer_id = buf.id;
  f.capacity = buf.capacity;
  f.state = FileState::kPersisted;
  f.version = next_allocation_id_++;
  f.created_unix_ns = f.committed_unix_ns = f.persisted_unix_ns = clock_->UnixNowNs();
  f.disk = disk;
  f.disk.seq = ++disk_seq_;
  if (it != files_.end()) {
    const FileInfo& was = it->second;
    f.tag = was.tag;
    if (SameStoredFile(was.disk, disk)) {  // the version this server wrote (or knew), brought back
      f.version = was.version;
      f.rank = was.rank;
      f.records = was.records;
      f.created_unix_ns = was.created_unix_ns;
      f.committed_unix_ns = was.committed_unix_ns;
    }
  }
  files_[fk] = f;
  if (!disk.etag.empty()) {
    ++counts_.fetched_objects;
    counts_.fetched_bytes += size;
  }
  Note(f, false);
  TCE_LOG(kInfo, "cache") << "fetched job=" << job << " path=" << path << " from " << from << " size=" << size
                          << " seconds=" << secs << " MBps=" << (secs > 0 ? size / secs / 1e6 : 0);
  return Status::OK();
}

}  // namespace tce
