// ReadGrants: who may read a job's published versions without owning the
// job: uids and gids of this node (inference processes running as another
// user), and other nodes that follow the job (docs/weights.md).
//
// A grant allows the version calls only (GetVersion, AcquireVersion and the
// fds of the buffers such a lease covers; for a node, PeerVersion and
// PeerReadRange of a version's files), never a load by path, a listing or a
// save. Grants come from the job's owner (per job, GrantRead) and from the
// server's `read_grants` setting (every job, uids and gids). A node that
// follows a job also serves the nodes its source passed on (the owner's
// grants travel down a chain of following nodes). A revoked grant is
// remembered, so a refused reader is told why. A job holds at most
// `max_per_job` uids, gids and nodes, granted and revoked together, so that
// an owner cannot make the server remember ids without bound. Plain data:
// the Cache calls it under its own lock.
//
// Security: the uid and gid passed in must be the session's (SO_PEERCRED),
// never a request's; a node's endpoint must be the one its link
// authenticated (PeerLink::peer()), never a request's field.
#pragma once

#include <sys/types.h>

#include <cstddef>
#include <map>
#include <set>
#include <string>

#include "common/status.h"

namespace tce {

class ReadGrants {
 public:
  struct Ids {
    std::set<uid_t> uids;
    std::set<gid_t> gids;
    std::set<std::string> nodes;  // peer endpoints, "host:port"
  };

  // Grants that hold for every job (the read_grants setting; uids and gids).
  void SetServerWide(Ids ids) { server_ = std::move(ids); }
  void set_max_per_job(size_t n) { max_per_job_ = n; }
  // Adds `ids` to the job's grants, or with `revoke` takes them away, and
  // sets *now to the job's grants; RESOURCE_EXHAUSTED (changing nothing)
  // when the job would hold more than max_per_job ids.
  Status Change(const std::string& job, const Ids& ids, bool revoke, Ids* now);
  // The uids, gids and nodes the job's grants remember, granted or revoked.
  size_t Entries(const std::string& job) const;
  // How many of `ids` the job's grants do not remember yet (what a Change
  // with them adds to Entries).
  size_t Unknown(const std::string& job, const Ids& ids) const;
  // The refusal Change would give `ids` now (OK: none).
  Status CanChange(const std::string& job, const Ids& ids) const;
  // Whether uid/gid may read the job's published versions by a grant. When
  // not, `why` says so (naming a revoked grant when there was one).
  bool Allows(const std::string& job, uid_t uid, gid_t gid, std::string* why) const;
  // Whether the node `endpoint` may follow the job; when not, `why` says
  // so (never naming the job's owner).
  bool AllowsNode(const std::string& job, const std::string& endpoint, std::string* why) const;
  // The nodes granted the job: the owner's grants here, and those passed on.
  std::set<std::string> Nodes(const std::string& job) const;
  // For a job this node follows: the nodes its source says the owner
  // granted (replacing those it said before).
  void PassOn(const std::string& job, std::set<std::string> nodes) { passed_on_[job] = std::move(nodes); }

 private:
  size_t max_per_job_ = static_cast<size_t>(-1);
  Ids server_;
  std::map<std::string, Ids> jobs_;
  std::map<std::string, Ids> revoked_;
  std::map<std::string, std::set<std::string>> passed_on_;
};

}  // namespace tce
