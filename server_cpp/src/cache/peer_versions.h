// PeerVersions: the versions a job publishes (docs/weights.md) as other
// nodes follow them: the source node answers a following node's asks for
// the newest version, its digests and ranged reads of its files
// (ring/peer_server_reads.cc); the following node records the versions
// and holds their files as replicas (ring/version_follower.h).
//
// Trust: a following node is the endpoint its link authenticated, never a
// request's field, and reads only what the job's owner granted it; who is
// granted is the publication's (cache/node_grants.h).
//
// Replicas is one (cache/replicas.h). Thread-safe.
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
#include "common/status.h"
#include "storage/object_store.h"  // ListedObject

namespace tce {

class PeerVersions {
 public:
  virtual ~PeerVersions() = default;

  // The digests (TagFile.crc32) a following node is given with a version,
  // which only the node that published it computes, from its own memory
  // (ring/peer_server_reads.cc): fills *tag's files with those recorded for
  // that version here, and gives a pinned read-only fd of each other file
  // of it this node holds of its own in memory as that version (never a
  // replica's: a replica's digest is its source's). EndPeerRead each pin.
  struct DigestPin {
    size_t file = 0;  // its index in tag->files
    uint64_t buffer_id = 0;
    int fd = -1;
  };
  virtual void VersionDigests(TagInfo* tag, std::vector<DigestPin>* pins) = 0;
  // Records the digests of `tag`'s files this node computed (those set).
  virtual void RecordDigests(const TagInfo& tag) = 0;
  // A buffer for a replica of `size` bytes of `job`'s version: a FREE buffer
  // of the job's owner that fits, reused (its id, and the sessions that keep
  // it mapped, stay: a reader's mapping of it is current again once the
  // replica is adopted), else a new one as ReserveRecovery makes. Give it
  // to AdoptReplica or AbandonRecovery.
  virtual Status ReserveReplica(const std::string& job, uint64_t size, std::unique_ptr<Buffer>* out) = 0;
  // A version of a job this node follows (NodeGrants::AddFollower first),
  // as a source gave it: recorded with its number and epoch
  // (TagRegistry::Follow: DATA_LOSS for a version that jumps too far).
  virtual Status AdoptFollowed(TagInfo tag) = 0;
  // A file of a followed version, brought here into `mem` (from
  // ReserveRecovery): held as a replica of that version (never persisted,
  // backed up or recorded; evictable once no lease holds it).
  virtual Status AdoptReplica(FileInfo f, uint64_t tag_version, std::unique_ptr<Buffer> mem) = 0;
  // As StartPeerRead, for a follower's reader (NodeGrants::
  // CheckPeerVersionRead passed): the file as the version recorded here as
  // `tag` published it (this node's own, or the replica brought for it);
  // NOT_FOUND when this node does not hold that version of it.
  virtual Status StartVersionRead(const std::string& job, const std::string& path, const std::string& tag,
                                  FileInfo* out, int* fd) = 0;
  // A following node's ranged read of a version was served (from memory or
  // a transfer in flight here): counted for Status.
  virtual void NoteVersionRangeServed() = 0;
  // The version recorded here as (job, tag); false when none.
  virtual bool VersionTag(const std::string& job, const std::string& tag, TagInfo* out) = 0;
  // Whether this node holds (job, path) in memory for the version recorded
  // as `tag`: its own file, or a replica brought for that version.
  virtual bool HoldsInMemory(const std::string& job, const std::string& path, const std::string& tag) = 0;
  // Gives back a buffer from ReserveReplica that was not adopted (as
  // RecoveryStore::AbandonRecovery).
  virtual void AbandonRecovery(std::unique_ptr<Buffer> mem) = 0;
};

}  // namespace tce
