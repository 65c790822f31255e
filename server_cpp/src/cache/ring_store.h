// RingStore: the Cache as the ring (ring/) sees it: the backup workers
// (ring/replicator.h) learn the job's ring (what they send and report is
// RingBackups', ring_backups.h); the peer port (ring/peer_server.h) and ranged reads
// (ring/range_reader.h) check who may hand over or read a job's files, and
// read this node's own files in memory; a load that misses
// (ring/ring_fetch.h) asks whether the ring may hold the file; tag markers
// wait for every node's files (ring/tag_barrier.h). What the ring brings
// back is RecoveryStore's (recovery_store.h), and the versions other nodes
// follow are PeerVersions' (peer_versions.h); RingStores puts them
// together.
//
// Trust: peers are other servers of the cluster, authenticated by the
// caller (ring/peer_link.h), but what they say of a job is checked here
// against the ring this server was told (CheckRingSender) and the uid the
// job belongs to here (CheckPeerUid); a recovered file is checked again on
// adoption (AdoptRecovered).
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
#include "cache/storage_loads.h"
#include "common/status.h"
#include "storage/object_store.h"  // ListedObject

namespace tce {

class RingStore {
 public:
  virtual ~RingStore() = default;

  // ---- the ring and who may act for a job ----
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

  // ---- peer reads ----
  // How many committed files of `job` this node holds in memory.
  virtual size_t InMemoryCount(const std::string& job) = 0;
  // For a ring member's read (ring/peer_server.h; the caller checked that
  // the peer is a member of the job's ring): the committed file (job, path)
  // this node holds in memory, its buffer pinned and a read-only fd in *fd
  // until EndPeerRead(out->buffer_id). NOT_FOUND if not in memory.
  virtual Status StartPeerRead(const std::string& job, const std::string& path, FileInfo* out, int* fd) = 0;
  virtual void EndPeerRead(uint64_t buffer_id) = 0;

};

// What the ring reaches of this node, one interface per concern; the Cache
// is each of them (RingStores::Of(&cache)).
struct RingStores {
  RingStore* ring = nullptr;
  RingBackups* backups = nullptr;      // backups to the successor (the Cache's backups)
  RecoveryStore* recovery = nullptr;
  PeerVersions* versions = nullptr;    // published versions across nodes (the Cache's replicas)
  NodeGrants* grants = nullptr;        // which nodes may follow a job (the Cache's publication)
  StorageLoads* loads = nullptr;       // reads of storage for the ring (the Cache's storage access)
  RestoreTracker* restores = nullptr;  // the replicator ends the restores it began
  template <class T>
  static RingStores Of(T* all) {
    return {all, all->backups(), all, all->replicas(), all->publication(), all->storage_access(), all->restores()};
  }
};

}  // namespace tce
