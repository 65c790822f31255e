#include "cache/job_owners.h"

namespace tce {

Status JobOwners::Check(uid_t uid, const std::string& job, const std::string& what) const {
  auto it = owners_.find(job);
  if (it == owners_.end() || it->second == uid || IsAdmin(uid)) return Status::OK();
  return Status::PermissionDenied("uid " + std::to_string(uid) + " may not " + what + ": job '" +
                                  job + "' belongs to uid " + std::to_string(it->second));
}

Status JobOwners::Claim(uid_t uid, const std::string& job, const std::string& what, bool* created) {
  if (created) *created = false;
  Status s = Check(uid, job, what);
  if (!s.ok() || owners_.count(job)) return s;  // keeps an existing owner
  if (JobsOf(uid) >= max_jobs_per_uid_)
    return Status::ResourceExhausted("uid " + std::to_string(uid) + " may not " + what + ": it owns " +
                                     std::to_string(JobsOf(uid)) + " jobs on this server (max_jobs_per_uid)");
  owners_.emplace(job, uid);
  ++counts_[uid];
  if (created) *created = true;
  return s;
}

void JobOwners::Unclaim(const std::string& job) {
  auto it = owners_.find(job);
  if (it == owners_.end()) return;
  auto c = counts_.find(it->second);
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
  return it != owners_.end() && it->second == uid;
}

bool JobOwners::Owner(const std::string& job, uid_t* uid) const {
  auto it = owners_.find(job);
  if (it == owners_.end()) return false;
  *uid = it->second;
  return true;
}

bool JobOwners::Restore(const std::string& job, uid_t uid) {
  auto [it, inserted] = owners_.emplace(job, uid);
  if (inserted) {
    ++counts_[uid];
  } else if (it->second == 0 && uid != 0) {
    auto c = counts_.find(0);
    if (c != counts_.end() && --c->second == 0) counts_.erase(c);
    it->second = uid;
    ++counts_[uid];
  }
  return inserted;
}

}  // namespace tce
