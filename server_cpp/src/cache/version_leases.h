// VersionLeases: the leases readers hold on published versions.
//
// A version lease covers one lease per file of the version that the server
// holds in memory (SessionTable leases: the buffer is neither reused nor
// evicted while leased). It ends when released, when its session ends, when
// its reader's grant is revoked, or at `expires` unless renewed. Every lease
// counts, whatever the version holds in memory: it is counted per session and
// per uid so that the Cache can bound both. Plain data: the Cache calls it
// under its own lock and does what ending a lease means for the buffers.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "common/clock.h"

namespace tce {

struct VersionLease {
  std::string session, job;
  uid_t uid = 0;  // the session's
  uint64_t version = 0;
  std::vector<uint64_t> file_leases;  // SessionTable lease ids
  uint64_t charged = 0;               // metadata bytes charged to uid (MetadataQuota)
  Clock::TimePoint expires;
};

class VersionLeases {
 public:
  // Records `lease`; returns its id (never 0).
  uint64_t Add(VersionLease lease);
  // The lease `id` of `session`, or null.
  VersionLease* Find(const std::string& session, uint64_t id);
  // The lease `id`, or null.
  const VersionLease* Get(uint64_t id) const;
  // Forgets the lease `id`, moving it to *out; false if unknown.
  bool Take(uint64_t id, VersionLease* out);
  // Leases whose time ran out at `now`.
  std::vector<uint64_t> Expired(Clock::TimePoint now) const;
  // The session's leases; the job's.
  std::vector<uint64_t> OfSession(const std::string& session) const;
  std::vector<uint64_t> OfJob(const std::string& job) const;
  // Every lease, in the order they were taken.
  std::vector<VersionLease> All() const;
  // How many leases the session holds; the uid's sessions together.
  size_t CountOfSession(const std::string& session) const;
  size_t CountOfUid(uid_t uid) const;
  size_t size() const { return leases_.size(); }

 private:
  std::map<uint64_t, VersionLease> leases_;
  std::map<std::string, size_t> by_session_;
  std::map<uid_t, size_t> by_uid_;
  uint64_t next_id_ = 1;
};

}  // namespace tce
