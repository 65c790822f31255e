// ReadGrants: which uids and gids may read a job's published versions
// without owning the job (inference processes running as another user).
//
// A grant allows the version calls only (GetVersion, AcquireVersion and the
// fds of the buffers such a lease covers), never a load by path, a listing
// or a save. Grants come from the job's owner (per job, GrantRead) and from
// the server's `read_grants` setting (every job). A revoked grant is
// remembered, so a refused reader is told why. A job holds at most
// `max_per_job` uids and gids, granted and revoked together, so that an
// owner cannot make the server remember ids without bound. Plain data: the
// Cache calls it under its own lock.
//
// Security: the uid and gid passed in must be the session's (SO_PEERCRED),
// never a request's.
#pragma once

#include <sys/types.h>

#include <cstddef>
#include <map>
#include <set>
#include <string>

#include "common/status.h"

namespace tce {

class ReadGrants {
 public:
  struct Ids {
    std::set<uid_t> uids;
    std::set<gid_t> gids;
  };

  // Grants that hold for every job (the read_grants setting).
  void SetServerWide(Ids ids) { server_ = std::move(ids); }
  void set_max_per_job(size_t n) { max_per_job_ = n; }
  // Adds `ids` to the job's grants, or with `revoke` takes them away, and
  // sets *now to the job's grants; RESOURCE_EXHAUSTED (changing nothing)
  // when the job would hold more than max_per_job ids.
  Status Change(const std::string& job, const Ids& ids, bool revoke, Ids* now);
  // The uids and gids the job's grants remember, granted or revoked.
  size_t Entries(const std::string& job) const;
  // How many of `ids` the job's grants do not remember yet (what a Change
  // with them adds to Entries).
  size_t Unknown(const std::string& job, const Ids& ids) const;
  // The refusal Change would give `ids` now (OK: none).
  Status CanChange(const std::string& job, const Ids& ids) const;
  // Whether uid/gid may read the job's published versions by a grant. When
  // not, `why` says so (naming a revoked grant when there was one).
  bool Allows(const std::string& job, uid_t uid, gid_t gid, std::string* why) const;

 private:
  size_t max_per_job_ = static_cast<size_t>(-1);
  Ids server_;
  std::map<std::string, Ids> jobs_;
  std::map<std::string, Ids> revoked_;
};

}  // namespace tce
