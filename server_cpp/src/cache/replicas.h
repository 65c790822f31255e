// Replicas: a job's published versions as they cross nodes (docs/weights.md).
// As a source, the node gives a following node each version's digests of
// its own files; as a following node, it records the versions its source
// names and holds the files brought for them as replicas, read under version
// leases, never persisted, backed up or recorded.
//
// It serves the ring through PeerVersions: the peer port as a source
// (ring/peer_server_reads.cc), the version follower as a following node
// (ring/version_follower.h). What a source says of a version (its job's
// name, its tag's shape, its number) is checked here before anything is
// recorded; the versions are the TagRegistry's; the buffers, the file
// table (a node's own files and its replicas) and the metadata quota are
// the Cache's, asked through ReplicaHost, each host call one step under the
// Cache's lock (so an eviction or a forgotten tag never falls between a
// replica's checks and its install).
//
// Locks: it holds none across a call (its only state of its own is a
// counter) and the Cache never calls it. Order: the Cache's lock, then the
// TagRegistry's. Thread-safe.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "cache/buffer.h"
#include "cache/cache_types.h"
#include "cache/peer_versions.h"
#include "cache/tag_registry.h"
#include "common/status.h"

namespace tce {

// What Replicas asks of the node's cache. Each call takes the cache's lock;
// none calls Replicas back.
class ReplicaHost {
 public:
  virtual ~ReplicaHost() = default;
  // PeerVersions::ReserveReplica's buffer: a FREE buffer of the job's owner
  // that fits, lent out with the sessions that keep it mapped, else a new
  // one within the budget (as RecoveryStore::ReserveRecovery makes).
  virtual Status LendBuffer(const std::string& job, uint64_t size, std::unique_ptr<Buffer>* out) = 0;
  // Takes back a buffer from LendBuffer that holds no replica: its bytes
  // leave the budget; the sessions that kept it mapped are told to unmap it.
  virtual void ReturnBuffer(std::unique_ptr<Buffer> mem) = 0;
  // Records `tag` (its names and shape checked) as a version of a job
  // followed here: FAILED_PRECONDITION when the job is not followed here,
  // DATA_LOSS when the TagRegistry refuses its number (TagRegistry::Follow);
  // the job's tags within its owner's metadata quota and max_tags_per_job
  // after; the replicas brought for the tag's earlier version are not this
  // version's. Waits for a newer version look again.
  virtual Status RecordFollowed(TagInfo tag) = 0;
  // Makes `mem` (from LendBuffer) the replica of f.path brought for version
  // `tag_version` of f.job: NOT_FOUND when that version is not here,
  // INVALID_ARGUMENT when it lists no such file of that size,
  // FAILED_PRECONDITION when the path is this node's own file of the job.
  // It replaces the path's earlier replica. On a refusal `mem` goes as
  // ReturnBuffer lets it go.
  virtual Status InstallReplica(FileInfo f, uint64_t tag_version, std::unique_ptr<Buffer> mem) = 0;
  // The file `tf` of version `tag` held in memory as that version published
  // it (the node's own, or, unless `own_only`, the replica brought for it):
  // its buffer pinned and a read-only fd in *fd until
  // RecoveryStore::EndPeerRead(out->buffer_id). NOT_FOUND when not held.
  virtual Status PinVersionFile(const TagInfo& tag, const TagFile& tf, bool own_only, FileInfo* out,
                                int* fd) = 0;
  // Whether (job, path) is held in memory for the version recorded as `tag`.
  virtual bool HoldsVersionFile(const std::string& job, const std::string& path, const std::string& tag) = 0;
};

class Replicas : public PeerVersions {
 public:
  // `tags` and `host` outlive it.
  Replicas(TagRegistry* tags, ReplicaHost* host);
  Replicas(const Replicas&) = delete;
  Replicas& operator=(const Replicas&) = delete;

  // ---- PeerVersions (cache/peer_versions.h) ----
  void VersionDigests(TagInfo* tag, std::vector<DigestPin>* pins) override;
  void RecordDigests(const TagInfo& tag) override;
  Status ReserveReplica(const std::string& job, uint64_t size, std::unique_ptr<Buffer>* out) override;
  Status AdoptFollowed(TagInfo tag) override;
  Status AdoptReplica(FileInfo f, uint64_t tag_version, std::unique_ptr<Buffer> mem) override;
  Status StartVersionRead(const std::string& job, const std::string& path, const std::string& tag,
                          FileInfo* out, int* fd) override;
  void NoteVersionRangeServed() override;
  bool VersionTag(const std::string& job, const std::string& tag, TagInfo* out) override;
  bool HoldsInMemory(const std::string& job, const std::string& path, const std::string& tag) override;
  void AbandonRecovery(std::unique_ptr<Buffer> mem) override;

  // Ranged reads of versions served to following nodes (for Stats; read
  // without a lock).
  uint64_t ranges_served() const { return ranges_served_.load(std::memory_order_relaxed); }

 private:
  TagRegistry* const tags_;  // its own lock
  ReplicaHost* const host_;
  std::atomic<uint64_t> ranges_served_{0};
};

}  // namespace tce
