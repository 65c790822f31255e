#include "cache/job_owners.h"

namespace tce {

Status JobOwners::Check(uid_t uid, const std::string& job, const std::string& what) const {
  auto it = owners_.find(job);
  if (it == owners_.end() || it->second == uid || IsAdmin(uid)) return Status::OK();
  return Status::PermissionDenied("uid " + std::to_string(uid) + " may not " + what + ": job '" +
                                  job + "' belongs to uid " + std::to_string(it->second));
}

Status JobOwners::Claim(uid_t uid, const std::string& job, const std::string& what) {
  Status s = Check(uid, job, what);
  if (s.ok()) owners_.emplace(job, uid);  // keeps an existing owner
  return s;
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

void JobOwners::Restore(const std::string& job, uid_t uid) {
  auto [it, inserted] = owners_.emplace(job, uid);
  if (!inserted && it->second == 0) it->second = uid;
}

}  // namespace tce
