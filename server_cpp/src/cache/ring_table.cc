#include "cache/ring_table.h"

#include <utility>

namespace tce {

std::string Ring::Predecessor() const {
  const size_t n = endpoints.size();
  return n == 0 ? "" : endpoints[(node_rank + n - 1) % n];
}

std::vector<std::string> Ring::Peers() const {
  std::vector<std::string> out;
  const size_t n = endpoints.size();
  for (size_t i = 1; i < n; ++i) out.push_back(endpoints[(node_rank + i) % n]);
  return out;
}

Status RingTable::Check(const std::string& job, int32_t node_rank,
                        const std::vector<std::string>& endpoints) {
  if (job.empty()) return Status::InvalidArgument("a ring needs a job");
  if (endpoints.empty()) return Status::InvalidArgument("a ring needs at least one endpoint");
  if (node_rank < 0 || static_cast<size_t>(node_rank) >= endpoints.size())
    return Status::InvalidArgument("node_rank " + std::to_string(node_rank) + " is outside the " +
                                   std::to_string(endpoints.size()) + "-node ring");
  for (const std::string& e : endpoints)
    if (e.empty() || e.find(':') == std::string::npos || e.find('\n') != std::string::npos)
      return Status::InvalidArgument("ring endpoint must be host:port, got '" + e + "'");
  return Status::OK();
}

bool RingTable::Install(const std::string& job, int32_t node_rank,
                        std::vector<std::string> endpoints) {
  Ring& ring = rings_[job];  // a new one has no successor and no owner
  const std::string before = ring.successor;
  ring.node_rank = node_rank;
  ring.endpoints = std::move(endpoints);
  ring.successor = ring.endpoints.size() > 1
                       ? ring.endpoints[(node_rank + 1) % ring.endpoints.size()]
                       : std::string();
  return ring.successor != before;
}

void RingTable::SetOwner(const std::string& job, uid_t uid, gid_t gid) {
  Ring& ring = rings_[job];
  ring.has_owner = true;
  ring.owner_uid = uid;
  ring.owner_gid = gid;
}

const Ring* RingTable::Find(const std::string& job) const {
  auto it = rings_.find(job);
  return it == rings_.end() ? nullptr : &it->second;
}

std::string RingTable::Successor(const std::string& job) const {
  const Ring* r = Find(job);
  return r ? r->successor : "";
}

std::vector<RingInfo> RingTable::All(const std::string& self) const {
  std::vector<RingInfo> out;
  for (const auto& [job, r] : rings_) out.push_back(RingInfo{job, self, r.node_rank, r.endpoints});
  return out;
}

}  // namespace tce
