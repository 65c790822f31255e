// RestorePlans: which node of a job's ring reads each file from storage when
// the job loads a checkpoint that no node has in memory (a restart on empty
// nodes; docs/ring.md, "Cooperative restore"). The unit is a directory (a
// tag's): its files, as storage lists them, are assigned to the ring's
// nodes by bytes (AssignByBytes), so every node that lists the same
// directory computes the same owners without asking anyone, and each file
// is read from storage by one node; the others pull it from that node's
// memory over the ring. A node found down (its peer port does not answer)
// is left out of the plans of its job for `down_for`, so its share goes to
// the others. Plans are made again after `ttl`, or when the ring or the
// nodes down change. Thread-safe.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "common/clock.h"
#include "common/log_limiter.h"
#include "common/mutex.h"
#include "common/status.h"
#include "storage/object_store.h"  // ListedObject

namespace tce {

// For each of `files`, the index (0 .. nodes-1) of the node that reads it:
// the largest first (ties by path), each to the node with the fewest bytes
// so far (ties to the lowest index). The same for any order of `files`.
std::vector<size_t> AssignByBytes(const std::vector<ListedObject>& files, size_t nodes);

class RestorePlans {
 public:
  using Lister = std::function<Status(const std::string& job, const std::string& dir, std::vector<ListedObject>*)>;

  RestorePlans(Lister list, Clock* clock = Clock::Real(), std::chrono::milliseconds ttl = std::chrono::seconds(30),
               std::chrono::milliseconds down_for = std::chrono::seconds(30));

  // The node of `nodes` (the job's ring, by node rank) that reads `path`
  // from storage: as the plan of its directory says, among the nodes not
  // down; a file storage did not list is placed by a hash of its path. ""
  // when every node is down.
  std::string OwnerOf(const std::string& job, const std::vector<std::string>& nodes, const std::string& path);
  // `node` did not answer for `job`: its share goes to the others, and
  // loads of the job ask it nothing, for `down_for` (logged once).
  void MarkDown(const std::string& job, const std::string& node);
  // Whether `node` is down for `job` now.
  bool IsDown(const std::string& job, const std::string& node);

 private:
  struct Plan {
    std::vector<std::string> nodes;  // the live nodes it was made for
    std::map<std::string, size_t> owner;
    Clock::TimePoint made;
  };
  std::vector<std::string> LiveNodes(const std::string& job, const std::vector<std::string>& nodes) REQUIRES(mu_);

  const Lister list_;
  Clock* const clock_;
  const std::chrono::milliseconds ttl_, down_for_;
  LogLimiter list_log_;  // listings that failed
  Mutex mu_;
  std::map<std::pair<std::string, std::string>, Plan> plans_ GUARDED_BY(mu_);  // (job, dir)
  std::map<std::pair<std::string, std::string>, Clock::TimePoint> down_ GUARDED_BY(mu_);  // (job, node) -> since
};

}  // namespace tce
