// RingStore: the Cache's files as the ring (ring/) sees them: tag markers
// wait for every node's files (ring/tag_barrier.h). The job's ring itself,
// and who may act for a job, are RingMembers' (ring_members.h); what the
// backup workers send and report is RingBackups' (ring_backups.h); what the
// ring brings back, and the reads of this node's own files in memory, are
// RecoveryStore's (recovery_store.h), and the versions other nodes follow
// are PeerVersions' (peer_versions.h); RingStores puts them together.
//
// Trust: peers are other servers of the cluster, authenticated by the
// caller (ring/peer_link.h), and checked against the job's ring and uid
// (RingMembers) before they read here; a recovered file is checked again
// on adoption (AdoptRecovered).
//
// The Cache is one. Thread-safe: the backup workers, the peer port's
// connection threads and RPC threads call it at once.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "cache/buffer.h"
#include "cache/cache_types.h"
#include "cache/load_split.h"
#include "cache/node_grants.h"
#include "cache/peer_versions.h"
#include "cache/recovery_store.h"
#include "cache/ring_backups.h"
#include "cache/restore_tracker.h"
#include "cache/ring_members.h"
#include "cache/storage_loads.h"
#include "common/status.h"
#include "storage/object_store.h"  // ListedObject

namespace tce {

class RingStore {
 public:
  virtual ~RingStore() = default;

  // ---- tag markers on object storage across nodes ----
  // A tag's marker (DCP's `.metadata`, DeepSpeed's `latest`) under an object
  // root is uploaded only once every file of its tag is durable. On a job
  // whose ring has other nodes, the marker's node waits for the tag's record
  // (CommitTag) and then for the other nodes to report their files of the
  // tag durable (ring/tag_barrier.h asks them).
  struct HeldMarker {
    FileKey key;
    uint64_t version = 0;
    std::vector<std::string> remote;  // the tag's files that are not this node's
  };
  // The markers whose own node's files are durable and that wait for other
  // nodes' files (counted as one round when there are any).
  virtual std::vector<HeldMarker> MarkersAwaitingPeers() = 0;
  // Every node reported the other files of the marker's tag durable: the
  // marker (that version of it) is uploaded now.
  virtual void PeersDurable(const FileKey& marker, uint64_t version) = 0;
  // For a ring member's question: those of `paths` (files of `job`) this
  // node has persisted (PERSISTED, or EVICTED since).
  virtual std::vector<std::string> DurableOf(const std::string& job, const std::vector<std::string>& paths) = 0;
};

// What the ring reaches of this node, one interface per concern: the Cache,
// or one of its components (RingStores::Of(&cache)).
struct RingStores {
  RingStore* ring = nullptr;
  RingMembers* members = nullptr;      // the job's ring, who may act for it (the Cache's rings)
  RingBackups* backups = nullptr;      // backups to the successor (the Cache's backups)
  RecoveryStore* recovery = nullptr;   // what the ring brings back, peers' reads (the Cache's recovery)
  PeerVersions* versions = nullptr;    // published versions across nodes (the Cache's replicas)
  NodeGrants* grants = nullptr;        // which nodes may follow a job (the Cache's publication)
  StorageLoads* loads = nullptr;       // reads of storage for the ring (the Cache's storage access)
  RestoreTracker* restores = nullptr;  // the replicator ends the restores it began
  template <class T>
  static RingStores Of(T* all) {
    return {all,           all->rings(),        all->backups(),        all->recovery(),
            all->replicas(), all->publication(), all->storage_access(), all->restores()};
  }
};

}  // namespace tce
