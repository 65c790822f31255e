// JobOwners: which uid owns each job, and what a uid may do with it.
//
// A job (its files, tags and ring) belongs to the uid that first wrote to it;
// from then on only that uid, and root when `root_is_admin`, may read,
// replace or remove anything of it. Ownership is never transferred or
// dropped while the server runs; after a restart it is re-derived from the
// files in metadata. Plain data: the Cache calls it under its own lock.
//
// Security: the uid passed in must come from SO_PEERCRED (the session's),
// never from the request.
#pragma once

#include <sys/types.h>

#include <map>
#include <string>

#include "common/status.h"

namespace tce {

class JobOwners {
 public:
  explicit JobOwners(bool root_is_admin = true) : root_is_admin_(root_is_admin) {}

  void set_root_is_admin(bool on) { root_is_admin_ = on; }
  bool IsAdmin(uid_t uid) const { return root_is_admin_ && uid == 0; }

  // OK when `uid` may act on `job`: it owns the job, nobody does yet, or it
  // is an administrator. Otherwise PERMISSION_DENIED "uid U may not <what>:
  // job 'J' belongs to uid O". `what` names the refused act, e.g.
  // "read /ckpt/a.pt of job 'j'".
  Status Check(uid_t uid, const std::string& job, const std::string& what) const;
  // Check, then makes `uid` the owner of a job that has none.
  Status Claim(uid_t uid, const std::string& job, const std::string& what);
  // Whether `uid` sees the job in listings (it owns it, or is an administrator).
  bool Visible(uid_t uid, const std::string& job) const;
  // The job's owner; false when it has none.
  bool Owner(const std::string& job, uid_t* uid) const;
  // A file recorded before a restart: its owner owns the job. A non-root
  // owner wins over root (root's files in a user's job are admin writes).
  void Restore(const std::string& job, uid_t uid);

 private:
  bool root_is_admin_;
  std::map<std::string, uid_t> owners_;  // job -> owner uid
};

}  // namespace tce
