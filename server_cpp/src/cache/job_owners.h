// JobOwners: which uid owns each job, and what a uid may do with it.
//
// A job (its files, tags and ring) belongs to the uid that first wrote to it;
// from then on only that uid, and root when `root_is_admin`, may read,
// replace or remove anything of it. Ownership is never transferred or
// dropped while the server runs; after a restart it is re-derived from the
// files in metadata. One uid owns at most `max_jobs_per_uid` jobs, so that a
// client cannot make the server remember names without bound (root
// included). With the owner goes its group (the primary gid its
// session or its files showed), so that what the server reads from storage
// for the job on its own (the ring's reads, prefetches) runs as the owner,
// whoever asked for it. Plain data: the Cache calls it under its own lock.
//
// Security: the uid and gid passed in must come from SO_PEERCRED (the
// session's) or metadata, never from the request.
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
  bool IsAdmin(uid_t uid) const { return AdminRule(root_is_admin_, uid); }
  // Who is an administrator: uid 0, when root_is_admin. The one place the
  // rule is written (the sessions' caller check applies it too).
  static bool AdminRule(bool root_is_admin, uid_t uid) { return root_is_admin && uid == 0; }

  // OK when `uid` may act on `job`: it owns the job, nobody does yet, or it
  // is an administrator. Otherwise PERMISSION_DENIED "uid U may not <what>:
  // job 'J' belongs to uid O". `what` names the refused act, e.g.
  // "read /ckpt/a.pt of job 'j'".
  Status Check(uid_t uid, const std::string& job, const std::string& what) const;
  // A group not known (an owner a peer vouched for).
  static constexpr gid_t kNoGid = static_cast<gid_t>(-1);

  // Check, then makes `uid` (of group `gid`) the owner of a job that has
  // none (*created: whether it did): RESOURCE_EXHAUSTED when `uid` owns
  // max_jobs_per_uid jobs already. The owner's own claim tells its group if
  // it was not known.
  Status Claim(uid_t uid, const std::string& job, const std::string& what, gid_t gid = kNoGid,
               bool* created = nullptr);
  // Undoes the Claim that created the job (its other records were refused).
  void Unclaim(const std::string& job);
  // Whether `uid` sees the job in listings (it owns it, or is an administrator).
  bool Visible(uid_t uid, const std::string& job) const;
  // The job's owner (and its group: kNoGid when not known); false when it
  // has none.
  bool Owner(const std::string& job, uid_t* uid, gid_t* gid = nullptr) const;
  // A file recorded before a restart: its owner owns the job. A non-root
  // owner wins over root (root's files in a user's job are admin writes).
  // Counted, whatever max_jobs_per_uid; returns whether the job is new.
  bool Restore(const std::string& job, uid_t uid, gid_t gid = kNoGid);
  size_t JobsOf(uid_t uid) const;

 private:
  struct Owned {
    uid_t uid;
    gid_t gid;
  };
  bool root_is_admin_;
  size_t max_jobs_per_uid_ = static_cast<size_t>(-1);
  std::map<std::string, Owned> owners_;  // job -> owner
  std::map<uid_t, size_t> counts_;       // owner uid -> jobs it owns
};

}  // namespace tce
