// MetadataQuota: the server's bookkeeping that lives outside the cache's
// buffers (complete tags, job names, read grants, version leases) counted
// in bytes, against one budget for the whole server (`metadata_budget`, a
// fixed share of the memory the server has beside its buffers) and a share
// of it per uid, so that no client can grow the server's heap until the
// kernel kills it (and with it every unpersisted checkpoint of the node).
//
// Records that come from this server's own past (metadata re-indexed at
// start) or from the job's ring are counted without a check (Force): they
// were admitted once, and refusing them would lose them. Every record a
// client asks for is checked first (Charge), and refused with
// RESOURCE_EXHAUSTED naming the bound it met.
//
// The byte figures are estimates of the heap a record takes (its strings
// plus a fixed overhead per node of the maps that hold it), the same for
// every record of a kind: a bound, not an allocator's count.
//
// Plain data: the Cache calls it under its own lock.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <map>
#include <string>

#include "cache/cache_types.h"
#include "common/status.h"

namespace tce {

// The bounds on what one client can make the server remember
// (docs/settings.md). Counts are per job, per uid or per session; bytes
// are MetadataQuota's.
struct MetadataLimits {
  uint64_t budget = 256ull << 20;       // metadata_budget: every uid's records together
  unsigned share_per_uid_percent = 25;  // metadata_share_per_uid: of `budget`, one uid's
  size_t max_jobs_per_uid = 4096;       // job names one uid owns
  size_t max_tags_per_job = 1024;       // complete tags kept per job (the oldest go)
  size_t max_grants_per_job = 256;      // uids and gids in a job's read grants (revoked ones too)
  size_t max_version_leases_per_uid = 4096;  // version leases one uid's sessions hold
};

class MetadataQuota {
 public:
  // Estimated heap bytes of each kind of record.
  static uint64_t TagBytes(const TagInfo& tag);
  static uint64_t JobBytes(const std::string& job);
  static constexpr uint64_t kGrantBytes = 64;  // one uid or gid in a job's grants
  static constexpr uint64_t kLeaseBytes = 256;  // one version lease (its file leases: kFileLeaseBytes each)
  static constexpr uint64_t kFileLeaseBytes = 64;

  explicit MetadataQuota(const MetadataLimits& limits = MetadataLimits()) { SetLimits(limits); }
  void SetLimits(const MetadataLimits& limits);
  const MetadataLimits& limits() const { return limits_; }

  // Counts `bytes` for `uid` if they fit in the uid's share and in the
  // budget; RESOURCE_EXHAUSTED naming the setting otherwise (`what` says
  // what was refused, e.g. "tag 'step9' of job 'llama'").
  Status Charge(uid_t uid, uint64_t bytes, const std::string& what);
  // Whether Charge would take `bytes` for `uid` now.
  bool Fits(uid_t uid, uint64_t bytes) const;
  // Counts `bytes` for `uid` whatever the bounds (records from metadata or
  // the ring).
  void Force(uid_t uid, uint64_t bytes);
  // Gives back what Charge or Force counted.
  void Credit(uid_t uid, uint64_t bytes);

  uint64_t used() const { return used_; }
  uint64_t used_by(uid_t uid) const;
  uint64_t per_uid() const { return per_uid_; }

 private:
  MetadataLimits limits_;
  uint64_t per_uid_ = 0;
  uint64_t used_ = 0;
  std::map<uid_t, uint64_t> by_uid_;  // uids with something counted only
};

}  // namespace tce
