// Cache: its side of published versions (cache/publication.h). The
// Publication keeps grants and leases; here are the files a version lease
// pins, and the answers about sessions, job owners and the metadata quota
// it asks for (PublicationSide, each under the Cache's lock).
#include "cache/cache.h"
#include "common/logging.h"

namespace tce {

class Cache::PublicationSide : public PublicationHost {
 public:
  explicit PublicationSide(Cache* cache) : c_(cache) {}

  Status CallerIds(const std::string& session, uid_t* uid, gid_t* gid) override {
    return c_->sessions_.CallerIds(session, uid, gid);
  }

  bool OwnerOf(const std::string& job, uid_t* uid) override {
    MutexLock lock(&c_->mu_);
    return c_->owners_.Owner(job, uid);
  }

  bool IsAdmin(uid_t uid) override {
    MutexLock lock(&c_->mu_);
    return c_->owners_.IsAdmin(uid);
  }

  Status ClaimJob(const std::string& session, const std::string& job, const std::string& what,
                  uid_t* owner) override {
    MutexLock lock(&c_->mu_);
    Status s = c_->CheckAccess(session, job, what, /*claim=*/true);
    if (!s.ok()) return s;
    *owner = c_->sessions_.Find(session)->uid;
    c_->owners_.Owner(job, owner);  // an administrator acts for the job's owner
    return Status::OK();
  }

  Status AdoptJob(const std::string& job, uid_t owner) override {
    MutexLock lock(&c_->mu_);
    uid_t here = 0;
    if (c_->owners_.Owner(job, &here) && here != owner)
      return Status::FailedPrecondition("job '" + job + "' belongs to uid " + std::to_string(here) +
                                        " here: a followed job is this server's own (uid " +
                                        std::to_string(owner) + "), so it cannot follow a job of that name");
    c_->RestoreOwner(job, owner);
    return Status::OK();
  }

  Status Charge(uid_t uid, uint64_t bytes, const std::string& what) override {
    MutexLock lock(&c_->mu_);
    return c_->quota_.Charge(uid, bytes, what);
  }

  void Credit(uid_t uid, uint64_t bytes) override {
    MutexLock lock(&c_->mu_);
    c_->quota_.Credit(uid, bytes);
  }

  Status PinVersion(const std::string& session, const TagInfo& tag, size_t session_leases, size_t uid_leases,
                    VersionGrant* out, std::vector<uint64_t>* file_leases, uid_t* uid,
                    uint64_t* charged) override {
    return c_->PinVersion(session, tag, session_leases, uid_leases, out, file_leases, uid, charged);
  }

  void Unpin(const std::vector<uint64_t>& file_leases, bool no_reuse) override {
    MutexLock lock(&c_->mu_);
    for (uint64_t lease : file_leases) {
      if (no_reuse) {
        auto b = c_->buffers_.find(c_->sessions_.BufferOf(lease));
        if (b != c_->buffers_.end()) b->second.no_reuse = true;
      }
      c_->DropLease(lease);
    }
  }

 private:
  Cache* const c_;
};

std::unique_ptr<PublicationHost> Cache::MakePublicationSide() { return std::make_unique<PublicationSide>(this); }

bool Cache::IsVersionsFile(const TagInfo& tag, const TagFile& tf, const FileInfo& f) const {
  if (f.size != tf.size) return false;
  auto snapshot = published_.find({tag.job, tag.tag});
  if (snapshot != published_.end()) {
    auto at = snapshot->second.find(tf.path);
    if (at != snapshot->second.end()) return at->second == f.version;
  }
  return f.committed_unix_ns <= tag.complete_unix_ns;
}

Status Cache::PinVersion(const std::string& session, const TagInfo& tag, size_t session_leases, size_t uid_leases,
                         VersionGrant* out, std::vector<uint64_t>* file_leases, uid_t* uid, uint64_t* charged) {
  MutexLock lock(&mu_);
  Status s = sessions_.Check(session);
  if (!s.ok()) return s;
  const std::string& job = tag.job;
  // First every check, then the leases: a refusal leaves nothing behind.
  std::vector<const FileInfo*> known;  // per file of the tag: what this node knows of it, or null
  std::vector<bool> held;              // ... and whether its bytes are in memory here
  size_t leases = 0;
  for (const TagFile& tf : tag.files) {
    const FileInfo* f = VersionFile(job, tf.path, tag.tag);
    if (f && !IsVersionsFile(tag, tf, *f))
      return Status::FailedPrecondition("version " + std::to_string(tag.version) + " of job '" + job +
                                        "' is gone: " + tf.path + " was saved again after it was published"
                                        " (read a newer version)");
    const bool in_memory = f && f->buffer_id != 0 && f->state != FileState::kEvicted &&
                           f->state != FileState::kDiscarded;
    known.push_back(f);
    held.push_back(in_memory);
    leases += in_memory;
  }
  // A version lease counts as one of the session's leases, beside the
  // files it holds in memory.
  s = sessions_.CanLease(session, leases + 1 + session_leases);
  if (!s.ok()) return s;
  const uid_t who = sessions_.Find(session)->uid;
  if (uid_leases >= quota_.limits().max_version_leases_per_uid)
    return Status::ResourceExhausted("uid " + std::to_string(who) + " holds " + std::to_string(uid_leases) +
                                     " version leases (max_version_leases_per_uid): release one first");
  const uint64_t bytes = MetadataQuota::kLeaseBytes + leases * MetadataQuota::kFileLeaseBytes;
  s = quota_.Charge(who, bytes, "a lease on version " + std::to_string(tag.version) + " of job '" + job + "'");
  if (!s.ok()) return s;
  out->files.clear();
  file_leases->clear();
  for (size_t i = 0; i < tag.files.size(); ++i) {
    const TagFile& tf = tag.files[i];
    if (held[i]) {
      out->files.push_back(*known[i]);
      file_leases->push_back(sessions_.AddLease(session, known[i]->buffer_id));
      ++buffers_[known[i]->buffer_id].leases;
      continue;
    }
    FileInfo f;
    if (known[i]) {
      f = *known[i];
      f.buffer_id = 0;
      f.capacity = 0;
    } else {
      f.job = job;
      f.tag = tag.tag;
      f.rank = tf.rank;
      f.path = tf.path;
      f.size = tf.size;
      f.reason = "not held by this server";
    }
    out->files.push_back(std::move(f));
  }
  sessions_.TakeUnmaps(session, &out->unmap_buffer_ids);
  *uid = who;
  *charged = bytes;
  return Status::OK();
}

}  // namespace tce
