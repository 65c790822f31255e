// VersionStore: the versions a job publishes (docs/weights.md) as the RPC
// layer (rpc/service.h) serves them to local readers: the newest version
// and the wait for a newer one, version leases, read grants. The fd socket
// (rpc/fd_server.h) ends the leases whose time ran out.
//
// The Cache is one. Thread-safe.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "cache/cache_types.h"
#include "cache/read_grants.h"
#include "common/clock.h"
#include "common/status.h"

namespace tce {

// A reader's lease on a published version (AcquireVersion).
struct VersionGrant {
  TagInfo tag;
  uint64_t lease_id = 0;
  std::chrono::milliseconds lease{0};  // as granted
  std::vector<FileInfo> files;         // one per file of the tag, in its order
  std::vector<uint64_t> unmap_buffer_ids;
};

// How far the readers of one job's versions are behind (VersionStore::Readers).
struct JobReaders {
  std::string job;
  uint64_t newest = 0;         // the newest version here (0: none left)
  uint64_t oldest_leased = 0;  // the lowest version a reader holds a lease on
  uint64_t leases = 0;
  uint64_t lag() const { return newest > oldest_leased ? newest - oldest_leased : 0; }
};

class VersionStore {
 public:
  virtual ~VersionStore() = default;

  // Readers: the job's owner, an administrator, or a uid/gid granted read
  // (GrantRead, the read_grants setting); anyone else is PERMISSION_DENIED
  // with the reason (a revoked grant is named).
  //
  // The job's newest version above `after`; when there is none, waits until
  // one is published, up to `wait` and `call_deadline` (DEADLINE_EXCEEDED),
  // or with `wait` <= 0 answers NOT_FOUND at once. It ends when its caller
  // goes, as Wait does.
  virtual Status GetVersion(const std::string& session, const std::string& job, uint64_t after,
                            std::chrono::milliseconds wait, Clock::TimePoint call_deadline,
                            TagInfo* out, const CallerGone& gone) = 0;
  // A lease on version `version` (0: the newest) for `lease` (<= 0: the
  // default; capped): each file of it in memory here is leased (neither
  // reused nor evicted, keep_last included). FAILED_PRECONDITION when a
  // file of the version was saved again after it was published.
  virtual Status AcquireVersion(const std::string& session, const std::string& job, uint64_t version,
                                std::chrono::milliseconds lease, VersionGrant* out) = 0;
  // Extends the session's version lease by `lease` from now (as in
  // AcquireVersion); NOT_FOUND when it ended.
  virtual Status RenewVersion(const std::string& session, uint64_t lease_id,
                              std::chrono::milliseconds lease, std::chrono::milliseconds* granted) = 0;
  virtual Status ReleaseVersion(const std::string& session, uint64_t lease_id) = 0;
  // The owner (or an administrator) grants read of the job's published
  // versions to uids/gids, or to following nodes (peer endpoints), or
  // revokes it; `ids` becomes the job's grants now in force.
  virtual Status GrantRead(const std::string& session, const std::string& job, ReadGrants::Ids* ids,
                           bool revoke) = 0;
  // Ends the version leases whose time ran out (called periodically): their
  // files can be evicted again, and their buffers are never reused (the
  // reader may still map them). Returns how many ended.
  virtual size_t ExpireVersionLeases() = 0;
  // Each job whose versions readers hold leases on, with how far they are
  // behind its newest: every job for an administrator (`all`), else `uid`'s.
  virtual std::vector<JobReaders> Readers(bool all, uid_t uid) = 0;
};

}  // namespace tce
