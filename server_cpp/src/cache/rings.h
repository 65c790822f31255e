// Rings: the cache's side of a job's ring membership (docs/architecture.md).
// It keeps the rings this server was told (RingTable) and the server's own
// peer endpoint, serves local clients through ClientRings (SetRing, the
// check before a ranged read) and the ring (ring/) through RingMembers, and
// rejoins the rings metadata recorded before a restart (RestoreRings).
//
// The files, their owners and the sessions are the Cache's, asked through
// RingsHost, each host call one step under the Cache's lock. Joining a
// ring is one such step (RingsHost::JoinRing): the Cache installs it here
// (Apply) and, with nothing of the job in memory, begins a restore, else
// re-queues the job's backups to a new successor.
//
// Locks: its own `mu_` is a leaf: the Cache calls the methods "for the
// Cache" with its lock held, and Rings never holds `mu_` while it calls the
// host. The table changes only in Apply, which the host calls under its own
// lock: with that lock held, the Ring that Find returns stays as it is.
// Order: the Cache's lock, then Rings', then the metadata sink's.
// Thread-safe.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <string>
#include <vector>

#include "cache/cache_types.h"
#include "cache/client_rings.h"
#include "cache/meta_sink.h"
#include "cache/ring_members.h"
#include "cache/ring_table.h"
#include "common/mutex.h"
#include "common/status.h"

namespace tce {

// A ring to join: told by a client's session (recorded in metadata, and
// `uid`/`gid` become the job's ring owner), or rejoined after a restart.
struct JoinedRing {
  std::string job;
  int32_t node_rank = 0;
  std::vector<std::string> endpoints;
  bool told = false;
  uid_t uid = 0;
  gid_t gid = 0;
};

// What Rings asks of the node's cache. Each call takes the cache's lock;
// none holds Rings' lock.
class RingsHost {
 public:
  virtual ~RingsHost() = default;
  // Whether `session` may set `job`'s ring (its errors as SetRing's, in
  // order: the session, a job named, the job's owner; a job nobody owns is
  // claimed for the session's uid); its uid and gid in *uid, *gid.
  virtual Status AdmitRingSetter(const std::string& session, const std::string& job, uid_t* uid,
                                 gid_t* gid) = 0;
  // Joins the ring as one step: Rings::Apply, then, with nothing of the job
  // in memory, a restore from the successor begins; when the successor
  // changed, the job's tags and files in memory are queued to it. Returns
  // the successor ("" for one node).
  virtual std::string JoinRing(const JoinedRing& ring) = 0;
  // The owner of the job's files here (JobOwners); false when none.
  virtual bool FileOwner(const std::string& job, uid_t* uid) = 0;
  // One step: the uid `job` belongs to (true, in *here), else the job is
  // claimed for `uid` (false).
  virtual bool OwnerOrClaim(const std::string& job, uid_t uid, uid_t* here) = 0;
  // Whether (job, path) is unknown here, or lost from memory but not
  // evicted or discarded.
  virtual bool LostFromMemory(const std::string& job, const std::string& path) = 0;
  // ClientRings::CheckRangeRead: the session's uid owns the job here.
  virtual Status CheckRangeRead(const std::string& session, const std::string& job) = 0;
};

class Rings : public ClientRings, public RingMembers {
 public:
  // `meta`: where rings told by clients are recorded (null: nowhere). The
  // sink and the host outlive it.
  Rings(MetaSink* meta, RingsHost* host);
  Rings(const Rings&) = delete;
  Rings& operator=(const Rings&) = delete;

  // ---- ClientRings (cache/client_rings.h) ----
  Status SetRing(const std::string& session, const std::string& job, int32_t node_rank,
                 std::vector<std::string> endpoints, std::string* successor) override EXCLUDES(mu_);
  Status CheckRangeRead(const std::string& session, const std::string& job) override;

  // ---- RingMembers (cache/ring_members.h) ----
  std::vector<std::string> RingPeers(const std::string& job) override EXCLUDES(mu_);
  std::vector<std::string> RingNodes(const std::string& job) override EXCLUDES(mu_);
  Status CheckRingSender(const std::string& job, int32_t node, const std::string& peer) override EXCLUDES(mu_);
  bool JobUid(const std::string& job, uid_t* uid) override EXCLUDES(mu_);
  Status CheckPeerUid(const std::string& job, bool named, uid_t uid, const std::string& peer,
                      const std::string& what, bool claim) override EXCLUDES(mu_);
  bool MayBeInRing(const std::string& job, const std::string& path) override EXCLUDES(mu_);

  // ---- for the daemon (and tests) ----
  // This server's peer endpoint: rings it is told are recorded for it, and
  // a ring told here must name it as this node. A setter, not a
  // constructor argument: the peer port that knows it binds after the
  // Cache is built (daemon/daemon.cc); set before the port serves.
  void SetSelfEndpoint(const std::string& endpoint) EXCLUDES(mu_);
  // Rings recorded in metadata before a restart: joined again, and (the
  // memory being empty) this node's files recovered from the ring.
  void RestoreRings(std::vector<RingInfo> rings);

  // ---- for the Cache (with its lock held, or none) ----
  // RingsHost::JoinRing's install, under the host's lock: a told ring is
  // recorded in metadata (once the self endpoint is known) and its owner
  // set. Returns whether the successor changed; *now: the ring as installed.
  bool Apply(const JoinedRing& ring, Ring* now) EXCLUDES(mu_);
  // The job's ring, or null. Only with the host's lock held (see above).
  const Ring* Find(const std::string& job) const EXCLUDES(mu_);
  // The job's successor; "" when it has no ring or is alone in it.
  std::string Successor(const std::string& job) const EXCLUDES(mu_);
  // The uid that set the job's ring (false: no client set it here).
  bool SetterUid(const std::string& job, uid_t* uid) const EXCLUDES(mu_);
  // Every ring, as metadata records it for this server (none while its
  // endpoint is unknown).
  std::vector<RingInfo> Recorded() const EXCLUDES(mu_);

 private:
  MetaSink* const meta_;
  RingsHost* const host_;
  mutable Mutex mu_;  // a leaf: see the header comment
  RingTable table_ GUARDED_BY(mu_);
  std::string self_endpoint_ GUARDED_BY(mu_);
};

}  // namespace tce
