// Cache: published versions for readers (docs/weights.md): the newest
// version and the wait for a newer one, version leases, read grants.
#include <algorithm>

#include "cache/cache.h"
#include "common/logging.h"

namespace tce {

namespace {

std::string Seconds(std::chrono::milliseconds d) {
  return std::to_string(d.count() / 1000) + "." + std::to_string(d.count() % 1000 / 100) + " s";
}

}  // namespace

Status Cache::CheckReader(const std::string& session, const std::string& job) {
  Status s = sessions_.Check(session);
  if (!s.ok()) return s;
  const SessionTable::Session* sess = sessions_.Find(session);
  return ReaderAllowed(sess->uid, sess->gid, job, /*admin_ok=*/true);
}

bool Cache::MayRead(uid_t uid, gid_t gid, const std::string& job, bool admin_ok, std::string* why) const {
  uid_t owner = 0;
  if (!owners_.Owner(job, &owner) || owner == uid || (admin_ok && owners_.IsAdmin(uid))) return true;
  return grants_.Allows(job, uid, gid, why);
}

Status Cache::ReaderAllowed(uid_t uid, gid_t gid, const std::string& job, bool admin_ok) {
  std::string why;
  if (MayRead(uid, gid, job, admin_ok, &why)) return Status::OK();
  uid_t owner = 0;
  owners_.Owner(job, &owner);
  uint64_t dropped = 0;
  const std::string msg = "uid " + std::to_string(uid) + " may not read the published versions of job '" +
                          job + "' (it belongs to uid " + std::to_string(owner) + "): " + why;
  if (refused_log_.Allow(&dropped)) TCE_LOG(kWarning, "access") << "refused: " << msg << Suppressed(dropped);
  return Status::PermissionDenied(msg);
}

Status Cache::GetVersion(const std::string& session, const std::string& job, uint64_t after,
                         std::chrono::milliseconds wait, Clock::TimePoint call_deadline, TagInfo* out,
                         const CallerGone& gone) {
  MutexLock lock(&mu_);
  const Clock::TimePoint start = clock_->Now();
  const Clock::TimePoint deadline =
      wait.count() <= 0 ? start : std::min(call_deadline, start + wait);
  for (;;) {
    Status s = CheckReader(session, job);  // again after each wait: a grant may be gone
    if (!s.ok()) return s;
    if (tags_.Newest(job, after, out)) return Status::OK();
    const std::string what = after ? "newer than " + std::to_string(after) : "published";
    if (wait.count() <= 0) return Status::NotFound("job '" + job + "' has no version " + what);
    if (versions_stopped_) return Status::Unavailable("the server is shutting down");
    if (clock_->Now() >= deadline || !BlockedWait(&versions_cv_, deadline, gone, &s)) {
      if (!s.ok()) return s;
      return Status::DeadlineExceeded("no version of job '" + job + "' " + what + " within " +
                                      Seconds(std::chrono::duration_cast<std::chrono::milliseconds>(
                                          clock_->Now() - start)));
    }
  }
}

bool Cache::IsVersionsFile(const TagInfo& tag, const TagFile& tf, const FileInfo& f) const {
  if (f.size != tf.size) return false;
  auto snapshot = published_.find({tag.job, tag.tag});
  if (snapshot != published_.end()) {
    auto at = snapshot->second.find(tf.path);
    if (at != snapshot->second.end()) return at->second == f.version;
  }
  return f.committed_unix_ns <= tag.complete_unix_ns;
}

std::chrono::milliseconds Cache::LeaseLength(std::chrono::milliseconds asked) const {
  if (asked.count() <= 0) asked = version_lease_;
  return std::min(asked, version_lease_max_);
}

Status Cache::AcquireVersion(const std::string& session, const std::string& job, uint64_t version,
                             std::chrono::milliseconds lease, VersionGrant* out) {
  MutexLock lock(&mu_);
  Status s = CheckReader(session, job);
  if (!s.ok()) return s;
  TagInfo tag;
  const bool found = version == 0 ? tags_.Newest(job, 0, &tag) : tags_.FindVersion(job, version, &tag);
  if (!found) {
    TagInfo newest;
    const std::string now = tags_.Newest(job, 0, &newest) ? "newest: " + std::to_string(newest.version)
                                                           : "none is published";
    return Status::NotFound("job '" + job + "' has no version " +
                            (version ? std::to_string(version) : std::string("published")) +
                            (version ? " (" + now + ")" : std::string()));
  }
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
  // Every version lease counts against the session's leases (one, beside
  // the files it holds in memory) and the uid's version leases, whatever
  // the version holds here.
  s = sessions_.CanLease(session, leases + 1 + version_leases_.CountOfSession(session));
  if (!s.ok()) return s;
  const uid_t uid = sessions_.Find(session)->uid;
  if (version_leases_.CountOfUid(uid) >= quota_.limits().max_version_leases_per_uid)
    return Status::ResourceExhausted("uid " + std::to_string(uid) + " holds " +
                                     std::to_string(version_leases_.CountOfUid(uid)) +
                                     " version leases (max_version_leases_per_uid): release one first");
  const uint64_t bytes = LeaseBytes(leases);
  s = quota_.Charge(uid, bytes, "a lease on version " + std::to_string(tag.version) + " of job '" + job + "'");
  if (!s.ok()) return s;
  VersionLease vl;
  vl.session = session;
  vl.job = job;
  vl.uid = uid;
  vl.version = tag.version;
  out->files.clear();
  for (size_t i = 0; i < tag.files.size(); ++i) {
    const TagFile& tf = tag.files[i];
    if (held[i]) {
      out->files.push_back(*known[i]);
      vl.file_leases.push_back(sessions_.AddLease(session, known[i]->buffer_id));
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
  out->lease = LeaseLength(lease);
  vl.expires = clock_->Now() + out->lease;
  out->tag = tag;
  out->lease_id = version_leases_.Add(std::move(vl));
  sessions_.TakeUnmaps(session, &out->unmap_buffer_ids);
  TCE_LOG(kInfo, "weights") << "leased job=" << job << " version=" << tag.version << " tag=" << tag.tag
                            << " session=" << session.substr(0, 8) << " files=" << tag.files.size()
                            << " in_memory=" << leases << " lease=" << Seconds(out->lease);
  return Status::OK();
}

Status Cache::RenewVersion(const std::string& session, uint64_t lease_id, std::chrono::milliseconds lease,
                           std::chrono::milliseconds* granted) {
  MutexLock lock(&mu_);
  Status s = sessions_.Check(session);
  if (!s.ok()) return s;
  VersionLease* vl = version_leases_.Find(session, lease_id);
  if (!vl)
    return Status::NotFound("no version lease " + std::to_string(lease_id) +
                            " in this session (released, expired, revoked, or never granted)");
  s = CheckReader(session, vl->job);  // a revoked grant renews nothing
  if (!s.ok()) {
    EndVersionLease(lease_id, "its reader may not read the job any more");
    return s;
  }
  *granted = LeaseLength(lease);
  vl->expires = clock_->Now() + *granted;
  return Status::OK();
}

Status Cache::ReleaseVersion(const std::string& session, uint64_t lease_id) {
  MutexLock lock(&mu_);
  Status s = sessions_.Check(session);
  if (!s.ok()) return s;
  if (!version_leases_.Find(session, lease_id))
    return Status::NotFound("no version lease " + std::to_string(lease_id) +
                            " in this session (released, expired, revoked, or never granted)");
  EndVersionLease(lease_id, nullptr);
  return Status::OK();
}

uint64_t Cache::LeaseBytes(size_t file_leases) {
  return MetadataQuota::kLeaseBytes + file_leases * MetadataQuota::kFileLeaseBytes;
}

void Cache::EndVersionLease(uint64_t id, const char* why) {
  VersionLease vl;
  if (!version_leases_.Take(id, &vl)) return;
  quota_.Credit(vl.uid, LeaseBytes(vl.file_leases.size()));
  for (uint64_t lease : vl.file_leases) {
    if (why) {
      auto b = buffers_.find(sessions_.BufferOf(lease));
      if (b != buffers_.end()) b->second.no_reuse = true;  // the reader may still map it
    }
    DropLease(lease);
  }
  if (why)
    TCE_LOG(kWarning, "weights") << "version lease " << id << " of job=" << vl.job << " version=" << vl.version
                                 << " (session " << vl.session.substr(0, 8) << ") ended: " << why
                                 << "; its memory may be evicted, its buffers are not reused";
}

size_t Cache::ExpireVersionLeases() {
  MutexLock lock(&mu_);
  const std::vector<uint64_t> ended = version_leases_.Expired(clock_->Now());
  for (uint64_t id : ended) EndVersionLease(id, "it expired unrenewed");
  return ended.size();
}

Status Cache::GrantRead(const std::string& session, const std::string& job, ReadGrants::Ids* ids, bool revoke) {
  MutexLock lock(&mu_);
  Status s = CheckAccess(session, job, std::string(revoke ? "revoke" : "grant") + " read of job '" + job + "'",
                         /*claim=*/true);
  if (!s.ok()) return s;
  uid_t owner = sessions_.Find(session)->uid;
  owners_.Owner(job, &owner);  // an administrator's grant counts against the job's owner
  const size_t added = grants_.Unknown(job, *ids);
  s = grants_.CanChange(job, *ids);
  if (s.ok())
    s = quota_.Charge(owner, added * MetadataQuota::kGrantBytes,
                      std::to_string(added) + " read grant(s) of job '" + job + "'");
  if (!s.ok()) return s;
  TCE_LOG(kInfo, "weights") << (revoke ? "revoked" : "granted") << " read of job=" << job << " uids="
                            << ids->uids.size() << " gids=" << ids->gids.size() << " nodes=" << ids->nodes.size();
  s = grants_.Change(job, *ids, revoke, ids);  // (checked above)
  if (!s.ok()) return s;
  if (revoke) EndRevokedLeases(job);
  return Status::OK();
}

void Cache::EndRevokedLeases(const std::string& job) {
  for (uint64_t id : version_leases_.OfJob(job)) {
    const VersionLease* vl = version_leases_.Get(id);
    const SessionTable::Session* sess = sessions_.Find(vl->session);
    std::string why;
    if (sess && MayRead(sess->uid, sess->gid, job, /*admin_ok=*/true, &why)) continue;
    EndVersionLease(id, "its reader's grant was revoked");
  }
}

}  // namespace tce
