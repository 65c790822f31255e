// NodeGrants: which other nodes may follow a job's published versions
// (docs/weights.md), and this node's side of following one.
//
// A source node answers a following node's ask for the newest version and
// checks each of its ranged reads (ring/peer_server_reads.cc); a following
// node records, for a job it follows, its local reader and the nodes its
// source says the owner granted (ring/version_follower.h).
//
// Trust: a following node is the endpoint its link authenticated, never a
// request's field, and reads only what the job's owner granted it.
//
// The Publication is one (cache/publication.h). Thread-safe.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "cache/cache_types.h"
#include "common/status.h"

namespace tce {

class NodeGrants {
 public:
  virtual ~NodeGrants() = default;

  // For a following node (`node`: the endpoint its link authenticated,
  // never a request's field): OK when the job's owner granted that node
  // read of its versions (VersionStore::GrantRead, or as the source of a
  // job this node follows passed the grants on), then the newest version
  // above `after` (any version, when `epoch`, the numbering `after` is of,
  // is set and is not the job's here), waiting up to `wait`
  // (DEADLINE_EXCEEDED when none came; *nodes set). NOT_FOUND when the job
  // is not here; PERMISSION_DENIED, naming no uid, when the node is not
  // granted. The tag lists the version's weight files only
  // (cache/weight_files.h). *nodes: the nodes granted the job.
  virtual Status PeerGetVersion(const std::string& job, uint64_t after, uint64_t epoch,
                                std::chrono::milliseconds wait, const std::string& node, TagInfo* out,
                                std::vector<std::string>* nodes) = 0;
  // For such a node's ranged read: OK when the node is granted and `path`
  // is a weight file of the version recorded here as `tag`.
  virtual Status CheckPeerVersionRead(const std::string& job, const std::string& tag, const std::string& path,
                                      const std::string& node) = 0;
  // A local user of uid `reader` follows `job`: the job belongs here to
  // `owner` (this server's own uid, never a uid a source names;
  // FAILED_PRECONDITION when another uid's job has the name) and `reader`
  // may read its versions.
  virtual Status AddFollower(const std::string& job, uid_t owner, uid_t reader) = 0;
  // The nodes a source of a job this node follows says the owner granted:
  // this node serves them the versions it holds (a chain of nodes).
  virtual void PassOnGrants(const std::string& job, const std::vector<std::string>& nodes) = 0;
};

}  // namespace tce
