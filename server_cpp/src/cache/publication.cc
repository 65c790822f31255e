// Publication: read grants, version leases and the waits for a version.
#include "cache/publication.h"

#include <algorithm>
#include <map>
#include <set>
#include <utility>

#include "cache/metadata_quota.h"
#include "cache/weight_files.h"
#include "common/logging.h"
#include "common/validate.h"

namespace tce {

namespace {

std::string Seconds(std::chrono::milliseconds d) {
  return std::to_string(d.count() / 1000) + "." + std::to_string(d.count() % 1000 / 100) + " s";
}

// A following node's refusal: why, and never whose the job is.
Status NodeRefused(const std::string& job, const std::string& node, const std::string& why) {
  return Status::PermissionDenied("node " + node + " may not follow job '" + job + "' here: " + why);
}

Status NoSuchLease(uint64_t lease_id) {
  return Status::NotFound("no version lease " + std::to_string(lease_id) +
                          " in this session (released, expired, revoked, or never granted)");
}

}  // namespace

Publication::Publication(PublicationOptions options, Clock* clock, TagRegistry* tags, PublicationHost* host)
    : version_lease_(options.version_lease),
      version_lease_max_(options.version_lease_max),
      clock_(clock),
      tags_(tags),
      host_(host) {
  MutexLock lock(&mu_);
  grants_.SetServerWide(std::move(options.read_grants));
  grants_.set_max_per_job(options.max_grants_per_job);
}

// ---- readers ----

Status Publication::CheckReader(const std::string& session, const std::string& job) {
  uid_t uid = 0;
  gid_t gid = 0;
  Status s = host_->CallerIds(session, &uid, &gid);
  if (!s.ok()) return s;
  return ReaderAllowed(uid, gid, job, /*admin_ok=*/true);
}

bool Publication::MayRead(uid_t uid, gid_t gid, const std::string& job, bool admin_ok, std::string* why) {
  uid_t owner = 0;
  if (!host_->OwnerOf(job, &owner) || owner == uid || (admin_ok && host_->IsAdmin(uid))) return true;
  return grants_.Allows(job, uid, gid, why);
}

Status Publication::ReaderAllowed(uid_t uid, gid_t gid, const std::string& job, bool admin_ok) {
  std::string why;
  if (MayRead(uid, gid, job, admin_ok, &why)) return Status::OK();
  uid_t owner = 0;
  host_->OwnerOf(job, &owner);
  uint64_t dropped = 0;
  const std::string msg = "uid " + std::to_string(uid) + " may not read the published versions of job '" +
                          job + "' (it belongs to uid " + std::to_string(owner) + "): " + why;
  if (refused_log_.Allow(&dropped)) TCE_LOG(kWarning, "access") << "refused: " << msg << Suppressed(dropped);
  return Status::PermissionDenied(msg);
}

Status Publication::GetVersion(const std::string& session, const std::string& job, uint64_t after,
                               std::chrono::milliseconds wait, Clock::TimePoint call_deadline, TagInfo* out,
                               const CallerGone& gone) {
  const Clock::TimePoint start = clock_->Now();
  const Clock::TimePoint deadline = wait.count() <= 0 ? start : std::min(call_deadline, start + wait);
  for (;;) {
    const uint64_t seen = Generation();  // before looking: a version recorded after it wakes the wait
    {
      MutexLock lock(&mu_);
      Status s = CheckReader(session, job);  // again after each wait: a grant may be gone
      if (!s.ok()) return s;
    }
    if (tags_->Newest(job, after, out)) return Status::OK();
    const std::string what = after ? "newer than " + std::to_string(after) : "published";
    if (wait.count() <= 0) return Status::NotFound("job '" + job + "' has no version " + what);
    Status s;
    if (!WaitChange(seen, deadline, gone, &s)) {
      if (!s.ok()) return s;
      return Status::DeadlineExceeded("no version of job '" + job + "' " + what + " within " +
                                      Seconds(std::chrono::duration_cast<std::chrono::milliseconds>(
                                          clock_->Now() - start)));
    }
  }
}

std::chrono::milliseconds Publication::LeaseLength(std::chrono::milliseconds asked) const {
  if (asked.count() <= 0) asked = version_lease_;
  return std::min(asked, version_lease_max_);
}

Status Publication::AcquireVersion(const std::string& session, const std::string& job, uint64_t version,
                                   std::chrono::milliseconds lease, VersionGrant* out) {
  MutexLock lock(&mu_);
  uid_t uid = 0;
  gid_t gid = 0;
  Status s = host_->CallerIds(session, &uid, &gid);
  if (s.ok()) s = ReaderAllowed(uid, gid, job, /*admin_ok=*/true);
  if (!s.ok()) return s;
  TagInfo tag;
  const bool found = version == 0 ? tags_->Newest(job, 0, &tag) : tags_->FindVersion(job, version, &tag);
  if (!found) {
    TagInfo newest;
    const std::string now = tags_->Newest(job, 0, &newest) ? "newest: " + std::to_string(newest.version)
                                                            : "none is published";
    return Status::NotFound("job '" + job + "' has no version " +
                            (version ? std::to_string(version) : std::string("published")) +
                            (version ? " (" + now + ")" : std::string()));
  }
  // Every version lease counts against the session's leases and the uid's
  // version leases, whatever the version holds here.
  VersionLease vl;
  s = host_->PinVersion(session, tag, leases_.CountOfSession(session), leases_.CountOfUid(uid), out,
                        &vl.file_leases, &vl.uid, &vl.charged);
  if (!s.ok()) return s;
  vl.session = session;
  vl.job = job;
  vl.version = tag.version;
  out->lease = LeaseLength(lease);
  vl.expires = clock_->Now() + out->lease;
  const size_t in_memory = vl.file_leases.size();
  out->tag = std::move(tag);
  out->lease_id = leases_.Add(std::move(vl));
  lease_count_.store(leases_.size(), std::memory_order_relaxed);
  TCE_LOG(kInfo, "weights") << "leased job=" << job << " version=" << out->tag.version << " tag=" << out->tag.tag
                            << " session=" << session.substr(0, 8) << " files=" << out->tag.files.size()
                            << " in_memory=" << in_memory << " lease=" << Seconds(out->lease);
  return Status::OK();
}

Status Publication::RenewVersion(const std::string& session, uint64_t lease_id, std::chrono::milliseconds lease,
                                 std::chrono::milliseconds* granted) {
  MutexLock lock(&mu_);
  uid_t uid = 0;
  gid_t gid = 0;
  Status s = host_->CallerIds(session, &uid, &gid);
  if (!s.ok()) return s;
  VersionLease* vl = leases_.Find(session, lease_id);
  if (!vl) return NoSuchLease(lease_id);
  s = ReaderAllowed(uid, gid, vl->job, /*admin_ok=*/true);  // a revoked grant renews nothing
  if (!s.ok()) {
    EndLease(lease_id, "its reader may not read the job any more");
    return s;
  }
  *granted = LeaseLength(lease);
  vl->expires = clock_->Now() + *granted;
  return Status::OK();
}

Status Publication::ReleaseVersion(const std::string& session, uint64_t lease_id) {
  MutexLock lock(&mu_);
  uid_t uid = 0;
  gid_t gid = 0;
  Status s = host_->CallerIds(session, &uid, &gid);
  if (!s.ok()) return s;
  if (!leases_.Find(session, lease_id)) return NoSuchLease(lease_id);
  EndLease(lease_id, nullptr);
  return Status::OK();
}

void Publication::EndLease(uint64_t id, const char* why) {
  VersionLease vl;
  if (!leases_.Take(id, &vl)) return;
  lease_count_.store(leases_.size(), std::memory_order_relaxed);
  host_->Credit(vl.uid, vl.charged);
  host_->Unpin(vl.file_leases, /*no_reuse=*/why != nullptr);  // the reader may still map them
  if (why)
    TCE_LOG(kWarning, "weights") << "version lease " << id << " of job=" << vl.job << " version=" << vl.version
                                 << " (session " << vl.session.substr(0, 8) << ") ended: " << why
                                 << "; its memory may be evicted, its buffers are not reused";
}

size_t Publication::ExpireVersionLeases() {
  MutexLock lock(&mu_);
  const std::vector<uint64_t> ended = leases_.Expired(clock_->Now());
  for (uint64_t id : ended) EndLease(id, "it expired unrenewed");
  return ended.size();
}

std::vector<JobReaders> Publication::Readers(bool all, uid_t uid) {
  std::map<std::string, JobReaders> by_job;
  {
    MutexLock lock(&mu_);
    for (const VersionLease& l : leases_.All()) {
      JobReaders& r = by_job[l.job];
      r.oldest_leased = r.leases++ == 0 ? l.version : std::min(r.oldest_leased, l.version);
    }
  }
  std::vector<JobReaders> out;
  for (auto& [job, r] : by_job) {
    uid_t owner = 0;
    if (!all && (!host_->OwnerOf(job, &owner) || owner != uid)) continue;
    r.job = job;
    TagInfo newest;
    if (tags_->Newest(job, 0, &newest)) r.newest = newest.version;
    out.push_back(std::move(r));
  }
  return out;
}

void Publication::SessionClosed(const std::string& session) {
  {
    MutexLock lock(&mu_);
    for (uint64_t id : leases_.OfSession(session)) EndLease(id, nullptr);
  }
  Changed();  // its waits end
}

// ---- grants ----

Status Publication::GrantRead(const std::string& session, const std::string& job, ReadGrants::Ids* ids,
                              bool revoke) {
  MutexLock lock(&mu_);
  uid_t owner = 0;  // an administrator's grant counts against the job's owner
  Status s = host_->ClaimJob(session, job, std::string(revoke ? "revoke" : "grant") + " read of job '" + job + "'",
                             &owner);
  if (!s.ok()) return s;
  const size_t added = grants_.Unknown(job, *ids);
  s = grants_.CanChange(job, *ids);
  if (s.ok())
    s = host_->Charge(owner, added * MetadataQuota::kGrantBytes,
                      std::to_string(added) + " read grant(s) of job '" + job + "'");
  if (!s.ok()) return s;
  TCE_LOG(kInfo, "weights") << (revoke ? "revoked" : "granted") << " read of job=" << job << " uids="
                            << ids->uids.size() << " gids=" << ids->gids.size() << " nodes=" << ids->nodes.size();
  s = grants_.Change(job, *ids, revoke, ids);  // (checked above)
  if (!s.ok()) return s;
  if (revoke) EndRevokedLeases(job);
  return Status::OK();
}

void Publication::EndRevokedLeases(const std::string& job) {
  for (uint64_t id : leases_.OfJob(job)) {
    const std::string session = leases_.Get(id)->session;
    uid_t uid = 0;
    gid_t gid = 0;
    std::string why;
    if (host_->CallerIds(session, &uid, &gid).ok() && MayRead(uid, gid, job, /*admin_ok=*/true, &why)) continue;
    EndLease(id, "its reader's grant was revoked");
  }
}

// ---- other nodes ----

Status Publication::PeerGetVersion(const std::string& job, uint64_t after, uint64_t epoch,
                                   std::chrono::milliseconds wait, const std::string& node, TagInfo* out,
                                   std::vector<std::string>* nodes) {
  // `after` of another numbering than the job's here (a restarted source,
  // or a node that followed another): any version is newer.
  if (epoch && epoch != tags_->Epoch(job)) after = 0;
  const Clock::TimePoint deadline = clock_->Now() + wait;
  *out = TagInfo();
  bool found = false;
  for (;;) {
    const uint64_t seen = Generation();
    {
      MutexLock lock(&mu_);  // the grant again after each wait: it may be gone
      uid_t owner = 0;
      if (!host_->OwnerOf(job, &owner)) return Status::NotFound("job '" + job + "' has no published version here");
      std::string why;
      if (!grants_.AllowsNode(job, node, &why)) return NodeRefused(job, node, why);
    }
    if ((found = tags_->Newest(job, after, out))) {
      *out = WeightFilesOf(std::move(*out));  // never the optimizer's state
      break;
    }
    Status s;
    if (!WaitChange(seen, deadline, CallerGone(), &s)) {
      if (!s.ok()) return s;
      break;
    }
  }
  MutexLock lock(&mu_);
  const std::set<std::string> granted = grants_.Nodes(job);
  nodes->assign(granted.begin(), granted.end());
  if (!found)
    return Status::DeadlineExceeded("job '" + job + "' has no version newer than " + std::to_string(after) + " here");
  return Status::OK();
}

Status Publication::CheckPeerVersionRead(const std::string& job, const std::string& tag, const std::string& path,
                                         const std::string& node) {
  MutexLock lock(&mu_);
  uid_t owner = 0;
  if (!host_->OwnerOf(job, &owner)) return Status::NotFound("job '" + job + "' has no published version here");
  std::string why;
  if (!grants_.AllowsNode(job, node, &why)) return NodeRefused(job, node, why);
  TagInfo t;
  if (!tags_->Find(job, tag, &t)) return Status::NotFound("no version " + tag + " of job '" + job + "' here");
  if (!IsWeightFile(path))
    return Status::PermissionDenied(path + " is no weight file of job '" + job +
                                    "': optimizer, scheduler and RNG states are not given to following nodes");
  for (const TagFile& f : t.files)
    if (f.path == path) return Status::OK();
  return Status::PermissionDenied(path + " is not a file of version " + std::to_string(t.version) + " (" + tag +
                                  ") of job '" + job + "' here");
}

Status Publication::AddFollower(const std::string& job, uid_t owner, uid_t reader) {
  Status s = ValidateName("job", job, /*allow_empty=*/false, /*allow_slash=*/true);
  if (!s.ok()) return s;
  MutexLock lock(&mu_);
  s = host_->AdoptJob(job, owner);
  if (!s.ok()) return s;
  if (reader != owner) return grants_.Change(job, ReadGrants::Ids{{reader}, {}, {}}, /*revoke=*/false, nullptr);
  return Status::OK();
}

void Publication::PassOnGrants(const std::string& job, const std::vector<std::string>& nodes) {
  MutexLock lock(&mu_);
  grants_.PassOn(job, {nodes.begin(), nodes.end()});
}

// ---- waits ----

void Publication::Changed() {
  MutexLock lock(&wait_mu_);
  ++generation_;
  changed_cv_.SignalAll();
}

void Publication::Stop() {
  MutexLock lock(&wait_mu_);
  stopped_ = true;
  changed_cv_.SignalAll();
}

uint64_t Publication::Generation() {
  MutexLock lock(&wait_mu_);
  return generation_;
}

bool Publication::WaitChange(uint64_t seen, Clock::TimePoint deadline, const CallerGone& gone, Status* status) {
  MutexLock lock(&wait_mu_);
  for (;;) {
    if (stopped_) {
      *status = Status::Unavailable("the server is shutting down");
      return false;
    }
    if (generation_ != seen) return true;
    if (gone && gone()) {
      *status = Status::Cancelled("the caller went away");
      return false;
    }
    const Clock::TimePoint now = clock_->Now();
    if (now >= deadline) return false;
    const Clock::TimePoint until = gone ? std::min(deadline, now + kCallerGonePoll) : deadline;
    if (until == Clock::TimePoint::max()) {
      changed_cv_.Wait(&wait_mu_);
    } else {
      clock_->WaitUntil(&changed_cv_, &wait_mu_, until);
    }
  }
}

}  // namespace tce
