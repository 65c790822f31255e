#include "cache/read_grants.h"

namespace tce {

ReadGrants::Ids ReadGrants::Change(const std::string& job, const Ids& ids, bool revoke) {
  Ids& now = jobs_[job];
  Ids& gone = revoked_[job];
  for (uid_t u : ids.uids) {
    if (revoke) {
      now.uids.erase(u);
      gone.uids.insert(u);
    } else {
      now.uids.insert(u);
      gone.uids.erase(u);
    }
  }
  for (gid_t g : ids.gids) {
    if (revoke) {
      now.gids.erase(g);
      gone.gids.insert(g);
    } else {
      now.gids.insert(g);
      gone.gids.erase(g);
    }
  }
  return now;
}

bool ReadGrants::Allows(const std::string& job, uid_t uid, gid_t gid, std::string* why) const {
  const bool known_gid = gid != static_cast<gid_t>(-1);
  if (server_.uids.count(uid) || (known_gid && server_.gids.count(gid))) return true;
  auto it = jobs_.find(job);
  if (it != jobs_.end() &&
      (it->second.uids.count(uid) || (known_gid && it->second.gids.count(gid))))
    return true;
  auto gone = revoked_.find(job);
  if (gone != revoked_.end() && gone->second.uids.count(uid)) {
    *why = "the owner revoked the read grant of uid " + std::to_string(uid);
  } else if (gone != revoked_.end() && known_gid && gone->second.gids.count(gid)) {
    *why = "the owner revoked the read grant of gid " + std::to_string(gid);
  } else {
    *why = "no read grant for uid " + std::to_string(uid) +
           (known_gid ? " or gid " + std::to_string(gid) : std::string());
  }
  return false;
}

}  // namespace tce
