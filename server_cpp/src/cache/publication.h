// Publication: who may read a job's published versions, and the readers'
// hold on them (docs/weights.md). It keeps the read grants (uids, gids and
// following nodes), the version leases and their lengths, and the waits
// for a newer version; the versions themselves are the TagRegistry's, the
// files and buffers the Cache's.
//
// It serves readers through VersionStore (the gRPC service; the fd socket
// expires leases) and other nodes through NodeGrants (the peer port; the
// version follower). What it needs of the node's files, sessions, job
// owners and metadata quota it asks through PublicationHost (the Cache).
//
// Locks: its own `mu_` is held across a call, host calls included (so a
// lease's checks and its record are one step); the Cache never calls it
// holding the Cache's lock except for Changed(), which takes only the
// waits' lock, `wait_mu_`, under which nothing else is called. Order:
// Publication::mu_, then the Cache's, then the TagRegistry's; wait_mu_
// last. Thread-safe.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "cache/node_grants.h"
#include "cache/read_grants.h"
#include "cache/tag_registry.h"
#include "cache/version_leases.h"
#include "cache/version_store.h"
#include "common/clock.h"
#include "common/log_limiter.h"
#include "common/mutex.h"
#include "common/status.h"

namespace tce {

// What the publication asks of the node's cache. Each call takes the
// cache's lock; none calls the publication back.
class PublicationHost {
 public:
  virtual ~PublicationHost() = default;
  // The session's uid and gid; its refusal when the session is unknown.
  virtual Status CallerIds(const std::string& session, uid_t* uid, gid_t* gid) = 0;
  // The job's owner here; false when no job of that name is here.
  virtual bool OwnerOf(const std::string& job, uid_t* uid) = 0;
  virtual bool IsAdmin(uid_t uid) = 0;
  // The session may change the job's grants (its owner, claiming a new
  // job, or an administrator): *owner is the job's owner after.
  virtual Status ClaimJob(const std::string& session, const std::string& job, const std::string& what,
                          uid_t* owner) = 0;
  // A followed job belongs here to `owner` (FAILED_PRECONDITION when another
  // uid's job has the name).
  virtual Status AdoptJob(const std::string& job, uid_t owner) = 0;
  // Metadata quota (MetadataQuota) of `uid`: charged (RESOURCE_EXHAUSTED
  // naming `what`) and credited back.
  virtual Status Charge(uid_t uid, uint64_t bytes, const std::string& what) = 0;
  virtual void Credit(uid_t uid, uint64_t bytes) = 0;
  // Leases each file of version `tag` held in memory here for `session`,
  // after checking that none was saved again since it was published
  // (FAILED_PRECONDITION), that the session may hold one more version lease
  // beside `session_leases` (its leases), that its uid holds fewer than its
  // limit beside `uid_leases`, and charging the lease's metadata: `out`
  // gets the files, in the tag's order, and the buffers to unmap;
  // *file_leases the leases taken, *charged the bytes charged to *uid.
  // Nothing is taken on a refusal.
  virtual Status PinVersion(const std::string& session, const TagInfo& tag, size_t session_leases,
                            size_t uid_leases, VersionGrant* out, std::vector<uint64_t>* file_leases,
                            uid_t* uid, uint64_t* charged) = 0;
  // Ends file leases from PinVersion (those of a closed session are gone
  // already); `no_reuse`: their buffers are never reused (the reader may
  // still map them).
  virtual void Unpin(const std::vector<uint64_t>& file_leases, bool no_reuse) = 0;
};

struct PublicationOptions {
  std::chrono::milliseconds version_lease{std::chrono::seconds(300)};      // when a reader asks none
  std::chrono::milliseconds version_lease_max{std::chrono::seconds(3600)};  // the most one gets
  ReadGrants::Ids read_grants;  // readers of every job's published versions
  size_t max_grants_per_job = static_cast<size_t>(-1);
};

class Publication : public VersionStore, public NodeGrants {
 public:
  // `tags` and `host` outlive it.
  Publication(PublicationOptions options, Clock* clock, TagRegistry* tags, PublicationHost* host);
  Publication(const Publication&) = delete;
  Publication& operator=(const Publication&) = delete;

  // ---- VersionStore (cache/version_store.h) ----
  Status GetVersion(const std::string& session, const std::string& job, uint64_t after,
                    std::chrono::milliseconds wait, Clock::TimePoint call_deadline, TagInfo* out,
                    const CallerGone& gone = {}) override EXCLUDES(mu_, wait_mu_);
  Status AcquireVersion(const std::string& session, const std::string& job, uint64_t version,
                        std::chrono::milliseconds lease, VersionGrant* out) override EXCLUDES(mu_);
  Status RenewVersion(const std::string& session, uint64_t lease_id, std::chrono::milliseconds lease,
                      std::chrono::milliseconds* granted) override EXCLUDES(mu_);
  Status ReleaseVersion(const std::string& session, uint64_t lease_id) override EXCLUDES(mu_);
  Status GrantRead(const std::string& session, const std::string& job, ReadGrants::Ids* ids,
                   bool revoke) override EXCLUDES(mu_);
  size_t ExpireVersionLeases() override EXCLUDES(mu_);
  std::vector<JobReaders> Readers(bool all, uid_t uid) override EXCLUDES(mu_);

  // ---- NodeGrants (cache/node_grants.h) ----
  Status PeerGetVersion(const std::string& job, uint64_t after, uint64_t epoch, std::chrono::milliseconds wait,
                        const std::string& node, TagInfo* out, std::vector<std::string>* nodes) override
      EXCLUDES(mu_, wait_mu_);
  Status CheckPeerVersionRead(const std::string& job, const std::string& tag, const std::string& path,
                              const std::string& node) override EXCLUDES(mu_);
  Status AddFollower(const std::string& job, uid_t owner, uid_t reader) override EXCLUDES(mu_);
  void PassOnGrants(const std::string& job, const std::vector<std::string>& nodes) override EXCLUDES(mu_);

  // ---- for the Cache ----
  // A version was recorded, or a session closed: waits look again. The
  // only call the Cache makes holding its own lock.
  void Changed() EXCLUDES(wait_mu_);
  // The session closed: its version leases end (their file leases went
  // with it). Called without the Cache's lock.
  void SessionClosed(const std::string& session) EXCLUDES(mu_);
  // The server stops: waits for a version end with UNAVAILABLE now.
  void Stop() EXCLUDES(wait_mu_);
  // Version leases held now (for Stats; read without a lock).
  size_t leases() const { return lease_count_.load(std::memory_order_relaxed); }

 private:
  // May the session's uid read the job's versions (owner, administrator or
  // grant)? The session's refusal, or PERMISSION_DENIED saying why.
  Status CheckReader(const std::string& session, const std::string& job) REQUIRES(mu_);
  Status ReaderAllowed(uid_t uid, gid_t gid, const std::string& job, bool admin_ok) REQUIRES(mu_);
  // ReaderAllowed's rule, quietly: *why says why not.
  bool MayRead(uid_t uid, gid_t gid, const std::string& job, bool admin_ok, std::string* why) REQUIRES(mu_);
  std::chrono::milliseconds LeaseLength(std::chrono::milliseconds asked) const;
  // Ends a version lease: its file leases are dropped; with a reason `why`
  // (it did not end by its reader's choice: expired, revoked) its buffers
  // are also marked no_reuse, and it is logged.
  void EndLease(uint64_t id, const char* why) REQUIRES(mu_);
  // Ends the leases on the job's versions whose readers may not read it
  // any more (a grant was revoked).
  void EndRevokedLeases(const std::string& job) REQUIRES(mu_);
  // How many times a version was recorded or a session closed so far; a
  // wait that read it before looking ends when it moves.
  uint64_t Generation() EXCLUDES(wait_mu_);
  // Waits until the generation moves past `seen`, `deadline` passes (false),
  // Stop (*status UNAVAILABLE, false) or, with `gone`, the caller goes
  // (*status CANCELLED, false; looked at least every kCallerGonePoll).
  bool WaitChange(uint64_t seen, Clock::TimePoint deadline, const CallerGone& gone, Status* status)
      EXCLUDES(wait_mu_);

  const std::chrono::milliseconds version_lease_, version_lease_max_;
  Clock* const clock_;
  TagRegistry* const tags_;  // its own lock
  PublicationHost* const host_;
  Mutex mu_ ACQUIRED_BEFORE(wait_mu_);
  ReadGrants grants_ GUARDED_BY(mu_);
  VersionLeases leases_ GUARDED_BY(mu_);
  std::atomic<size_t> lease_count_{0};
  LogLimiter refused_log_{5, std::chrono::seconds(10)};  // thread-safe
  Mutex wait_mu_;
  CondVar changed_cv_;
  uint64_t generation_ GUARDED_BY(wait_mu_) = 0;
  bool stopped_ GUARDED_BY(wait_mu_) = false;
};

}  // namespace tce
