// RingMembers: a job's ring as the ring (ring/) sees it: who its nodes are,
// whom this node takes copies from, and the uid the job belongs to. The
// backup workers (ring/replicator.h) learn the job's peers; the peer port
// (ring/peer_server.h) and ranged reads (ring/range_reader.h) check who may
// hand over or read a job's files; a load that misses (ring/ring_fetch.h)
// asks whether the ring may hold the file; tag markers (ring/tag_barrier.h)
// ask the job's peers.
//
// Trust: peers are other servers of the cluster, authenticated by the
// caller (ring/peer_link.h), but what they say of a job is checked here
// against the ring this server was told (CheckRingSender) and the uid the
// job belongs to here (CheckPeerUid).
//
// The Rings component is one (cache/rings.h; RingStores::members).
// Thread-safe: the backup workers, the peer port's connection threads and
// RPC threads call it at once.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <string>
#include <vector>

#include "common/status.h"

namespace tce {

class RingMembers {
 public:
  virtual ~RingMembers() = default;

  // The other members of the job's ring, the successor first (empty: no ring).
  virtual std::vector<std::string> RingPeers(const std::string& job) = 0;
  // Every node of the job's ring, by node rank (empty: no ring, or one node).
  virtual std::vector<std::string> RingNodes(const std::string& job) = 0;
  // OK when `peer` is node `node` of the job's ring as this server was told
  // it: only that node may hand it copies and tags as that node's.
  // PERMISSION_DENIED naming who is, or that no ring is known.
  virtual Status CheckRingSender(const std::string& job, int32_t node, const std::string& peer) = 0;
  // The uid `job` belongs to here: the owner of its files, else the uid
  // that set its ring; false when nobody owns it here yet. A job belongs to
  // one uid on every node of its ring: peers name it with every copy, tag
  // and request (ring/peer_server.h), so a ring is the job's name and its
  // uid, not the name alone.
  virtual bool JobUid(const std::string& job, uid_t* uid) = 0;
  // OK when `peer` (acting for `job` as uid `uid`; `named` false: it named
  // none) may do `what`: the job belongs to that uid here, or to nobody
  // yet and `claim` (then it does from now on). Else PERMISSION_DENIED.
  virtual Status CheckPeerUid(const std::string& job, bool named, uid_t uid, const std::string& peer,
                              const std::string& what, bool claim) = 0;
  // Whether a load that missed (job, path) may find it in the ring: it is
  // unknown here, or lost from memory, but not evicted by us (the ring's
  // copy goes when the original is evicted).
  virtual bool MayBeInRing(const std::string& job, const std::string& path) = 0;
};

}  // namespace tce
