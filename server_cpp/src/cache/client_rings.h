// ClientRings: a job's ring as local clients (rpc/service.h) tell it and
// read through it: SetRing, and the check before a ranged read (ReadRange).
// Security as ClientStore's (client_store.h): every call names a session
// and acts with its uid; a ring is set by the job's owner only (setting it
// claims the job for a new one).
//
// The Rings component is one (cache/rings.h; ClientStores::rings).
// Thread-safe: gRPC's worker threads call it at once.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/status.h"

namespace tce {

class ClientRings {
 public:
  virtual ~ClientRings() = default;

  // Sets the job's ring: this node's rank and every node's peer endpoint.
  // Committed files of the job (and every later commit) are then backed up to
  // the successor, node (rank + 1) mod n; with one node there is none.
  virtual Status SetRing(const std::string& session, const std::string& job, int32_t node_rank,
                         std::vector<std::string> endpoints, std::string* successor) = 0;
  // Whether `session` may read ranges of `job`'s files from this node's
  // memory and its ring (ReadRange): its uid owns the job here (it saved
  // into it or told its ring), or is an administrator. UNAUTHENTICATED for
  // an unknown session, else PERMISSION_DENIED saying why.
  virtual Status CheckRangeRead(const std::string& session, const std::string& job) = 0;
};

}  // namespace tce
