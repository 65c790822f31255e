#include "cache/rings.h"

#include <utility>

#include "common/logging.h"

namespace tce {

Rings::Rings(MetaSink* meta, RingsHost* host) : meta_(meta), host_(host) {}

Status Rings::SetRing(const std::string& session, const std::string& job, int32_t node_rank,
                      std::vector<std::string> endpoints, std::string* successor) {
  JoinedRing ring{job, node_rank, {}, /*told=*/true};
  Status s = host_->AdmitRingSetter(session, job, &ring.uid, &ring.gid);
  if (!s.ok()) return s;
  s = RingTable::Check(job, node_rank, endpoints);
  if (!s.ok()) return s;
  std::string self;
  {
    MutexLock lock(&mu_);
    self = self_endpoint_;
  }
  // A ring names this server as one of its nodes, or it is not this
  // server's ring: nobody makes a server another node of a job.
  const std::string& named = endpoints[static_cast<size_t>(node_rank)];
  if (!self.empty() && endpoints.size() > 1 && named != self)
    return Status::InvalidArgument("endpoints[" + std::to_string(node_rank) + "] is " + named +
                                   ", but this server is " + self + ": a ring names each server as its own node");
  ring.endpoints = std::move(endpoints);
  *successor = host_->JoinRing(ring);
  return Status::OK();
}

Status Rings::CheckRangeRead(const std::string& session, const std::string& job) {
  return host_->CheckRangeRead(session, job);
}

void Rings::SetSelfEndpoint(const std::string& endpoint) {
  MutexLock lock(&mu_);
  self_endpoint_ = endpoint;
}

void Rings::RestoreRings(std::vector<RingInfo> rings) {
  for (RingInfo& r : rings) {
    if (!RingTable::Check(r.job, r.node_rank, r.endpoints).ok()) continue;
    TCE_LOG(kInfo, "ring") << "rejoining the ring of job=" << r.job << " recorded in metadata";
    host_->JoinRing(JoinedRing{r.job, r.node_rank, std::move(r.endpoints)});
  }
}

bool Rings::Apply(const JoinedRing& ring, Ring* now) {
  MutexLock lock(&mu_);
  if (ring.told && meta_ && !self_endpoint_.empty())
    meta_->RecordRing(RingInfo{ring.job, self_endpoint_, ring.node_rank, ring.endpoints});
  const bool changed = table_.Install(ring.job, ring.node_rank, ring.endpoints);
  if (ring.told) table_.SetOwner(ring.job, ring.uid, ring.gid);
  *now = *table_.Find(ring.job);
  return changed;
}

const Ring* Rings::Find(const std::string& job) const {
  MutexLock lock(&mu_);
  return table_.Find(job);
}

std::string Rings::Successor(const std::string& job) const {
  MutexLock lock(&mu_);
  return table_.Successor(job);
}

bool Rings::SetterUid(const std::string& job, uid_t* uid) const {
  MutexLock lock(&mu_);
  const Ring* ring = table_.Find(job);
  if (!ring || !ring->has_owner) return false;
  *uid = ring->owner_uid;
  return true;
}

std::vector<RingInfo> Rings::Recorded() const {
  MutexLock lock(&mu_);
  if (self_endpoint_.empty()) return {};
  return table_.All(self_endpoint_);
}

Status Rings::CheckRingSender(const std::string& job, int32_t node, const std::string& peer) {
  MutexLock lock(&mu_);
  const Ring* ring = table_.Find(job);
  if (!ring)
    return Status::PermissionDenied("this server was not told job " + job + "'s ring: it takes copies "
                                    "only from the node the ring names (tell it the ring)");
  if (node < 0 || static_cast<size_t>(node) >= ring->endpoints.size() || node == ring->node_rank)
    return Status::PermissionDenied("node " + std::to_string(node) + " is not another node of job " + job +
                                    "'s ring here");
  if (ring->endpoints[static_cast<size_t>(node)] != peer)
    return Status::PermissionDenied(peer + " is not node " + std::to_string(node) + " of job " + job +
                                    "'s ring here (" + ring->endpoints[static_cast<size_t>(node)] + " is)");
  return Status::OK();
}

bool Rings::JobUid(const std::string& job, uid_t* uid) {
  return host_->FileOwner(job, uid) || SetterUid(job, uid);
}

Status Rings::CheckPeerUid(const std::string& job, bool named, uid_t uid, const std::string& peer,
                           const std::string& what, bool claim) {
  if (!named)
    return Status::PermissionDenied(peer + " names no uid for job " + job + ": it may not " + what);
  uid_t here = 0;
  const bool owned = claim ? host_->OwnerOrClaim(job, uid, &here) : JobUid(job, &here);
  if (!owned) {
    if (!claim)
      return Status::PermissionDenied("job " + job + " belongs to no uid here yet: " + peer + " may not " + what);
    return Status::OK();  // claimed: the ring's node vouches for its job's uid
  }
  if (here != uid)
    return Status::PermissionDenied("job " + job + " belongs to uid " + std::to_string(here) + " here, and " + peer +
                                    " acts for it as uid " + std::to_string(uid) + ": it may not " + what +
                                    " (a job belongs to one uid on every node of its ring)");
  return Status::OK();
}

std::vector<std::string> Rings::RingPeers(const std::string& job) {
  MutexLock lock(&mu_);
  const Ring* ring = table_.Find(job);
  return ring ? ring->Peers() : std::vector<std::string>();
}

std::vector<std::string> Rings::RingNodes(const std::string& job) {
  MutexLock lock(&mu_);
  const Ring* ring = table_.Find(job);
  return ring && ring->endpoints.size() > 1 ? ring->endpoints : std::vector<std::string>();
}

bool Rings::MayBeInRing(const std::string& job, const std::string& path) {
  return !Successor(job).empty() && host_->LostFromMemory(job, path);
}

}  // namespace tce
