#include "cache/job_owners.h"

namespace tce {

Status JobOwners::Check(uid_t uid, const std::string& job, const std::string& what) const {
  auto it = owners_.find(job);
  if (it == owners_.end() || it->second.uid == uid || IsAdmin(uid)) return Status::OK();
  return Status::PermissionDenied("uid " + std::to_string(uid) + " may not " + what + ": job '" +
                                  job + "' belongs to uid " + std::to_string(it->second.uid));
}

Status JobOwners::Claim(uid_t uid, const std::string& job, const std::string& what, gid_t gid, bool* created) {
  if (created) *created = false;
  Status s = Check(uid, job, what);
  if (!s.ok()) return s;
  auto it = owners_.find(job);
  if (it != owners_.end()) {  // keeps an existing owner
    if (it->second.uid == uid && it->second.gid == kNoGid) it->second.gid = gid;
    return s;
  }
  if (JobsOf(uid) >= max_jobs_per_uid_)
    return Status::ResourceExhausted("uid " + std::to_string(uid) + " may not " + what + ": it owns " +
                                     std::to_string(JobsOf(uid)) + " jobs on this server (max_jobs_per_uid)");
  owners_.emplace(job, Owned{uid, gid});
  ++counts_[uid];
  if (created) *created = true;
  return s;
}

void JobOwners::Unclaim(const std::string& job) {
  auto it = owners_.find(job);
  if (it == owners_.end()) return;
  auto c = counts_.find(it->second.uid);
  if (c != counts_.end() && --c->second == 0) counts_.erase(c);
  owners_.erase(it);
}

size_t JobOwners::JobsOf(uid_t uid) const {
  auto it = counts_.find(uid);
  return it == counts_.end() ? 0 : it->second;
}

bool JobOwners::Visible(uid_t uid, const std::string& job) const {
  if (IsAdmin(uid)) return true;
  auto it = owners_.find(job);
  return it != owners_.end() && it->second.uid == uid;
}

bool JobOwners::Owner(const std::string& job, uid_t* uid, gid_t* gid) const {
  auto it = owners_.find(job);
  if (it == owners_.end()) return false;
  *uid = it->second.uid;
  if (gid) *gid = it->second.gid;
  return true;
}

bool JobOwners::Restore(const std::string& job, uid_t uid, gid_t gid) {
  auto [it, inserted] = owners_.emplace(job, Owned{uid, gid});
  if (inserted) {
    ++counts_[uid];
  } else if (it->second.uid == 0 && uid != 0) {
    auto c = counts_.find(0);
    if (c != counts_.end() && --c->second == 0) counts_.erase(c);
    it->second = Owned{uid, gid};
    ++counts_[uid];
  } else if (it->second.uid == uid && it->second.gid == kNoGid) {
    it->second.gid = gid;
  }
  return inserted;
}

}  // namespace tce
