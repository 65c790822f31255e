// JobOwners: which uid owns each job, and what a uid may do with it.
//
// A job (its files, tags and ring) belongs to the uid that first wrote to it;
// from then on only that uid, and root when `root_is_admin`, may read,
// replace or remove anything of it. Ownership is never transferred or
// dropped while the server runs; after a restart it is re-derived from the
// files in metadata. One uid owns at most `max_jobs_per_uid` jobs, so that a
// client cannot make the server remember names without bound (root included).
// Plain data: the Cache calls it under its own lock.
//
// Security: the uid passed in must come from SO_PEERCRED (the session's),
// never from the request.
#pragma once

#include <sys/types.h>

#include <cstddef>
#include <map>
#include <string>

#include "common/status.h"

namespace tce {

class JobOwners {
 public:
  explicit JobOwners(bool root_is_admin = true) : root_is_admin_(root_is_admin) {}

  void set_root_is_admin(bool on) { root_is_admin_ = on; }
  void set_max_jobs_per_uid(size_t n) { max_jobs_per_uid_ = n; }
  bool IsAdmin(uid_t uid) const { return root_is_admin_ && uid == 0; }

  // OK when `uid` may act on `job`: it owns the job, nobody does yet, or it
  // is an administrator. Otherwise PERMISSION_DENIED "uid U may not <what>:
  // job 'J' belongs to uid O". `what` names the refused act, e.g.
  // "read /ckpt/a.pt of job 'j'".
  Status Check(uid_t uid, const std::string& job, const std::string& what) const;
  // Check, then makes `uid` the owner of a job that has none (*created:
  // whether it did): RESOURCE_EXHAUSTED when `uid` owns max_jobs_per_uid
  // jobs already.
  Status Claim(uid_t uid, const std::string& job, const std::string& what, bool* created = nullptr);
  // Undoes the Claim that created the job (its other records were refused).
  void Unclaim(const std::string& job);
  // Whether `uid` sees the job in listings (it owns it, or is an administrator).
  bool Visible(uid_t uid, const std::string& job) const;
  // The job's owner; false when it has none.
  bool Owner(const std::string& job, uid_t* uid) const;
  // A file recorded before a restart: its owner owns the job. A non-root
  // owner wins over root (root's files in a user's job are admin writes).
  // Counted, whatever max_jobs_per_uid; returns whether the job is new.
  bool Restore(const std::string& job, uid_t uid);
  size_t JobsOf(uid_t uid) const;

 private:
  bool root_is_admin_;
  size_t max_jobs_per_uid_ = static_cast<size_t>(-1);
  std::map<std::string, uid_t> owners_;  // job -> owner uid
  std::map<uid_t, size_t> counts_;       // owner uid -> jobs it owns
};

}  // namespace tce
