// ReadGrants: which uids and gids may read a job's published versions
// without owning the job (inference processes running as another user).
//
// A grant allows the version calls only (GetVersion, AcquireVersion and the
// fds of the buffers such a lease covers), never a load by path, a listing
// or a save. Grants come from the job's owner (per job, GrantRead) and from
// the server's `read_grants` setting (every job). A revoked grant is
// remembered, so a refused reader is told why. Plain data: the Cache calls
// it under its own lock.
//
// Security: the uid and gid passed in must be the session's (SO_PEERCRED),
// never a request's.
#pragma once

#include <sys/types.h>

#include <map>
#include <set>
#include <string>

namespace tce {

class ReadGrants {
 public:
  struct Ids {
    std::set<uid_t> uids;
    std::set<gid_t> gids;
  };

  // Grants that hold for every job (the read_grants setting).
  void SetServerWide(Ids ids) { server_ = std::move(ids); }
  // Adds `ids` to the job's grants, or with `revoke` takes them away;
  // returns the job's grants now.
  Ids Change(const std::string& job, const Ids& ids, bool revoke);
  // Whether uid/gid may read the job's published versions by a grant. When
  // not, `why` says so (naming a revoked grant when there was one).
  bool Allows(const std::string& job, uid_t uid, gid_t gid, std::string* why) const;

 private:
  Ids server_;
  std::map<std::string, Ids> jobs_;
  std::map<std::string, Ids> revoked_;
};

}  // namespace tce
