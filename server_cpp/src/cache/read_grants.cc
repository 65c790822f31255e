#include "cache/read_grants.h"

namespace tce {

namespace {

template <class T>
void Move(const std::set<T>& ids, bool revoke, std::set<T>* now, std::set<T>* gone) {
  for (const T& id : ids) {
    if (revoke) {
      now->erase(id);
      gone->insert(id);
    } else {
      now->insert(id);
      gone->erase(id);
    }
  }
}

size_t Count(const std::map<std::string, ReadGrants::Ids>& m, const std::string& job) {
  auto it = m.find(job);
  return it == m.end() ? 0 : it->second.uids.size() + it->second.gids.size() + it->second.nodes.size();
}

}  // namespace

size_t ReadGrants::Entries(const std::string& job) const { return Count(jobs_, job) + Count(revoked_, job); }

size_t ReadGrants::Unknown(const std::string& job, const Ids& ids) const {
  auto g = jobs_.find(job), r = revoked_.find(job);
  auto known = [&](auto member, const auto& id) {
    return (g != jobs_.end() && (g->second.*member).count(id)) ||
           (r != revoked_.end() && (r->second.*member).count(id));
  };
  size_t n = 0;
  for (uid_t u : ids.uids) n += !known(&Ids::uids, u);
  for (gid_t gid : ids.gids) n += !known(&Ids::gids, gid);
  for (const std::string& node : ids.nodes) n += !known(&Ids::nodes, node);
  return n;
}

Status ReadGrants::CanChange(const std::string& job, const Ids& ids) const {
  const size_t more = Unknown(job, ids);
  if (Entries(job) + more <= max_per_job_) return Status::OK();
  return Status::ResourceExhausted("job '" + job + "' may hold at most " + std::to_string(max_per_job_) +
                                   " granted or revoked uids, gids and nodes (max_grants_per_job); it holds " +
                                   std::to_string(Entries(job)) + " and this call names " + std::to_string(more) +
                                   " more");
}

Status ReadGrants::Change(const std::string& job, const Ids& ids, bool revoke, Ids* result) {
  Status s = CanChange(job, ids);
  if (!s.ok()) return s;
  Ids& now = jobs_[job];
  Ids& gone = revoked_[job];
  Move(ids.uids, revoke, &now.uids, &gone.uids);
  Move(ids.gids, revoke, &now.gids, &gone.gids);
  Move(ids.nodes, revoke, &now.nodes, &gone.nodes);
  if (result) *result = now;
  return Status::OK();
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

bool ReadGrants::AllowsNode(const std::string& job, const std::string& endpoint, std::string* why) const {
  auto it = jobs_.find(job);
  if (it != jobs_.end() && it->second.nodes.count(endpoint)) return true;
  auto passed = passed_on_.find(job);
  if (passed != passed_on_.end() && passed->second.count(endpoint)) return true;
  auto gone = revoked_.find(job);
  *why = gone != revoked_.end() && gone->second.nodes.count(endpoint)
             ? "the owner revoked the read grant of node " + endpoint
             : "no read grant for node " + endpoint;
  return false;
}

std::set<std::string> ReadGrants::Nodes(const std::string& job) const {
  std::set<std::string> out;
  if (auto it = jobs_.find(job); it != jobs_.end()) out = it->second.nodes;
  if (auto it = passed_on_.find(job); it != passed_on_.end()) out.insert(it->second.begin(), it->second.end());
  return out;
}

}  // namespace tce
