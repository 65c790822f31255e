// VersionLeases: the leases readers hold on published versions.
//
// A version lease covers one lease per file of the version that the server
// holds in memory (SessionTable leases: the buffer is neither reused nor
// evicted while leased). It ends when released, when its session ends, or
// at `expires` unless renewed. Plain data: the Cache calls it under its own
// lock and does what ending a lease means for the buffers.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "common/clock.h"

namespace tce {

struct VersionLease {
  std::string session, job;
  uint64_t version = 0;
  std::vector<uint64_t> file_leases;  // SessionTable lease ids
  Clock::TimePoint expires;
};

class VersionLeases {
 public:
  // Records `lease`; returns its id (never 0).
  uint64_t Add(VersionLease lease);
  // The lease `id` of `session`, or null.
  VersionLease* Find(const std::string& session, uint64_t id);
  // Forgets the lease `id`, moving it to *out; false if unknown.
  bool Take(uint64_t id, VersionLease* out);
  // Leases whose time ran out at `now`.
  std::vector<uint64_t> Expired(Clock::TimePoint now) const;
  // The session's leases.
  std::vector<uint64_t> OfSession(const std::string& session) const;
  size_t size() const { return leases_.size(); }

 private:
  std::map<uint64_t, VersionLease> leases_;
  uint64_t next_id_ = 1;
};

}  // namespace tce
