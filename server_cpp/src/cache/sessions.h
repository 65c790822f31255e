// Sessions: the client sessions (one per connection on the fd socket) and
// the leases they hold on loaded files, as a component beside the Cache
// (docs/architecture.md). It serves the fd socket and the RPC layer through
// SessionStore, and keeps what is the sessions' own: the SessionTable (each
// session's uid, gid and pid, when it was last used, its leases within
// max_leases_per_session, the unmaps it is owed) and whether root is an
// administrator (SessionLimits::root_is_admin).
//
// What a session holds in the Cache (its PENDING allocations, the buffers
// it maps, what its leases pin) is the Cache's: closing a session, the fd
// of a buffer and which sessions are busy are asked through SessionHost,
// each host call one step under the Cache's lock. A session is forgotten
// only in the host's step that ends what it holds (Forget), so a call that
// checked its session under the Cache's lock keeps it to its end, as
// before.
//
// Locks: its own `mu_` is a leaf: the Cache calls the methods "for the
// Cache" with its lock held, and Sessions never holds `mu_` while it calls
// the host. Order: the Cache's lock, then Sessions'. Thread-safe.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <set>
#include <string>
#include <vector>

#include "cache/session_limits.h"
#include "cache/session_store.h"
#include "cache/session_table.h"
#include "common/clock.h"
#include "common/mutex.h"
#include "common/status.h"

namespace tce {

// What Sessions asks of the node's cache. Each call takes the cache's lock;
// none holds Sessions' lock.
class SessionHost {
 public:
  virtual ~SessionHost() = default;
  // SessionStore::CloseSession as one step: the session's PENDING
  // allocations aborted, its leases dropped, its mappings ended, and the
  // session forgotten (Sessions::Forget); false when it is unknown.
  virtual bool EndSession(const std::string& session) = 0;
  // After EndSession, with no lock held: what else the session held ends
  // (its version leases, its waits for a version).
  virtual void SessionEnded(const std::string& session) = 0;
  // The sessions with a PENDING allocation (never idle).
  virtual std::set<std::string> BusySessions() = 0;
  // SessionStore::FdFor as one step (the session checked, the buffer's
  // owner or lease, the fd made, the mapping noted).
  virtual Status FdFor(const std::string& session, uint64_t buffer_id, int* fd, bool* writable,
                       uint64_t* capacity, bool keep_mapped) = 0;
};

class Sessions : public SessionStore {
 public:
  // `limits`: max_leases_per_session and root_is_admin. Idle times are
  // measured on `clock`. The host outlives it.
  Sessions(const SessionLimits& limits, SessionHost* host, Clock* clock = Clock::Real());
  Sessions(const Sessions&) = delete;
  Sessions& operator=(const Sessions&) = delete;

  // ---- SessionStore (cache/session_store.h) ----
  std::string OpenSession(uid_t uid, pid_t pid, gid_t gid = static_cast<gid_t>(-1)) override EXCLUDES(mu_);
  void CloseSession(const std::string& session) override EXCLUDES(mu_);
  std::vector<std::string> IdleSessions(std::chrono::milliseconds idle) override EXCLUDES(mu_);
  Status CheckCaller(const std::string& session, bool* admin, uid_t* uid = nullptr) override EXCLUDES(mu_);
  Status CallerIds(const std::string& session, uid_t* uid, gid_t* gid) override EXCLUDES(mu_);
  Status FdFor(const std::string& session, uint64_t buffer_id, int* fd, bool* writable, uint64_t* capacity,
               bool keep_mapped = false) override;

  // ---- for the Cache (with its lock held, or none): SessionTable's ----
  // UNAUTHENTICATED for an unknown session; else notes it was used.
  Status Check(const std::string& id) EXCLUDES(mu_);
  // The session, or null; does not count as a use. Only its uid, gid and
  // pid (fixed when it opened) may be read, and only while the caller holds
  // the host's lock: the session is forgotten only under it (Forget).
  const SessionTable::Session* Find(const std::string& id) const EXCLUDES(mu_);
  // Forgets the session, its leases dropped first. Only in the host's
  // EndSession step.
  void Forget(const std::string& id) EXCLUDES(mu_);
  void OweUnmap(const std::string& id, uint64_t buffer_id) EXCLUDES(mu_);
  void TakeUnmaps(const std::string& id, std::vector<uint64_t>* out) EXCLUDES(mu_);
  Status CanLease(const std::string& id, size_t more = 1) const EXCLUDES(mu_);
  uint64_t AddLease(const std::string& id, uint64_t buffer_id) EXCLUDES(mu_);
  Status CheckLease(const std::string& id, uint64_t lease_id) const EXCLUDES(mu_);
  uint64_t DropLease(uint64_t lease_id) EXCLUDES(mu_);
  std::vector<uint64_t> LeasesOf(const std::string& id) const EXCLUDES(mu_);
  uint64_t BufferOf(uint64_t lease_id) const EXCLUDES(mu_);
  bool Leases(const std::string& id, uint64_t buffer_id) const EXCLUDES(mu_);
  // The sessions open and the leases they hold (CacheStats).
  size_t size() const EXCLUDES(mu_);
  size_t leases() const EXCLUDES(mu_);

 private:
  SessionHost* const host_;
  const bool root_is_admin_;  // uid 0 is an administrator (JobOwners::AdminRule)
  mutable Mutex mu_;          // a leaf: see the header comment
  SessionTable table_ GUARDED_BY(mu_);
};

}  // namespace tce
