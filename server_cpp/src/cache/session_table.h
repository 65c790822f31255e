// SessionTable: the client sessions (one per connection on the fd socket),
// the leases they hold on loaded files, and the buffer unmaps each is owed.
//
// A session carries the uid, gid and pid the fd socket read with
// SO_PEERCRED; its id is 128 random bits, the only thing a client shows on
// later calls. Leases are counted per session and capped (`max_leases`).
// The table knows buffer ids only: what a lease or an unmap means for a
// buffer is the Cache's business. Plain data: Sessions (cache/sessions.h)
// keeps it under its own lock.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "common/clock.h"
#include "common/status.h"

namespace tce {

class SessionTable {
 public:
  // Idle times are measured on `clock`.
  explicit SessionTable(Clock* clock = Clock::Real()) : clock_(clock) {}

  struct Session {
    uid_t uid = 0;
    gid_t gid = static_cast<gid_t>(-1);
    pid_t pid = 0;
    Clock::TimePoint last_used;  // the last request naming it
    size_t leases = 0;
    std::vector<uint64_t> pending_unmap;  // delivered with the next response
  };

  // A new session with a fresh random id.
  std::string Open(uid_t uid, pid_t pid, gid_t gid);
  // The session named `id`, noted as used now; null when unknown.
  Session* Use(const std::string& id);
  // UNAUTHENTICATED for an unknown session; else notes it was used.
  Status Check(const std::string& id);
  // The session, or null; does not count as a use.
  const Session* Find(const std::string& id) const;
  // Forgets the session; its leases must have been dropped first.
  void Erase(const std::string& id);
  size_t size() const { return sessions_.size(); }
  // Sessions with no lease, not in `busy`, and unused for `idle`.
  std::vector<std::string> Idle(std::chrono::milliseconds idle,
                                const std::set<std::string>& busy) const;

  // `buffer_id` must be unmapped by the session: delivered by TakeUnmaps.
  void OweUnmap(const std::string& id, uint64_t buffer_id);
  // Appends (and forgets) the unmaps owed to the session.
  void TakeUnmaps(const std::string& id, std::vector<uint64_t>* out);

  void set_max_leases(size_t n) { max_leases_ = n; }
  // RESOURCE_EXHAUSTED when `more` leases would take the session past `max_leases`.
  Status CanLease(const std::string& id, size_t more = 1) const;
  // A new lease of `buffer_id` for a known session; returns its id (never 0).
  uint64_t AddLease(const std::string& id, uint64_t buffer_id);
  // NOT_FOUND unless the session holds lease `lease_id`.
  Status CheckLease(const std::string& id, uint64_t lease_id) const;
  // Ends the lease; returns the buffer it held, or 0 for an unknown lease.
  uint64_t DropLease(uint64_t lease_id);
  // The session's lease ids.
  std::vector<uint64_t> LeasesOf(const std::string& id) const;
  // The buffer lease `lease_id` holds; 0 for an unknown lease.
  uint64_t BufferOf(uint64_t lease_id) const;
  // Whether the session holds a lease on `buffer_id`.
  bool Leases(const std::string& id, uint64_t buffer_id) const;
  size_t leases() const { return leases_.size(); }

 private:
  struct Lease {
    std::string session;
    uint64_t buffer_id = 0;
  };

  Clock* const clock_;
  std::map<std::string, Session> sessions_;
  std::map<uint64_t, Lease> leases_;
  uint64_t next_lease_id_ = 1;
  size_t max_leases_ = 4096;
};

}  // namespace tce
