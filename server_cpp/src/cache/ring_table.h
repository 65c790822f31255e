// RingTable: the rings this server was told, by job: this node's rank, every
// node's peer endpoint, the successor its files are backed up to, and who
// told it (the owner of files recovered for the job that metadata does not
// know). Plain data the Rings component keeps (cache/rings.h), which the
// Cache consults to decide what to back up and whom to trust; the ring's
// work itself is in ring/. Not thread-safe: Rings guards it with its lock.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "cache/cache_types.h"
#include "common/status.h"

namespace tce {

struct Ring {
  int32_t node_rank = 0;
  std::vector<std::string> endpoints;
  std::string successor;  // empty: one node, no backups
  bool has_owner = false;  // told by a client's session (not only by metadata)
  uid_t owner_uid = 0;
  gid_t owner_gid = 0;

  std::string Predecessor() const;
  // The other members, the successor first.
  std::vector<std::string> Peers() const;
};

class RingTable {
 public:
  // Why a ring a client names is invalid (INVALID_ARGUMENT), else OK.
  static Status Check(const std::string& job, int32_t node_rank,
                      const std::vector<std::string>& endpoints);

  // Sets the job's ring (its owner, if any, stays); returns whether the
  // successor changed.
  bool Install(const std::string& job, int32_t node_rank, std::vector<std::string> endpoints);
  void SetOwner(const std::string& job, uid_t uid, gid_t gid);
  // The job's ring, or null.
  const Ring* Find(const std::string& job) const;
  // The job's successor; "" when it has no ring or is alone in it.
  std::string Successor(const std::string& job) const;
  // Every ring, as metadata records it for the server at `self`.
  std::vector<RingInfo> All(const std::string& self) const;

 private:
  std::map<std::string, Ring> rings_;
};

}  // namespace tce
