// RecoveryStore: the Cache as the ring brings files back into it and as
// peers read this node's files (ring/replicator.h, ring/peer_server.h,
// ring/range_reader.h): this node's own files and tags pulled back from the
// ring after a restart or a node's loss (the cooperative restore's reads of
// storage are StorageLoads'), and the files in memory a ring member reads.
//
// Trust: what a peer hands back is checked on adoption (AdoptRecovered,
// CheckRecoveredTag), never taken on its word; a peer's read is checked by
// the caller (the peer is a member of the job's ring).
//
// Served by the Cache's Recovery component (cache/recovery.h). Thread-safe.
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
#include "common/status.h"

namespace tce {

class RecoveryStore {
 public:
  virtual ~RecoveryStore() = default;

  // Room (within the budget) for a file pulled back from the ring.
  virtual Status ReserveRecovery(uint64_t size, std::unique_ptr<Buffer>* out) = 0;
  // Installs a pulled file (CRCs verified) as BACKED_UP at `f.backup_holder`,
  // unless a save of the path arrived meanwhile (FAILED_PRECONDITION) or its
  // size or CRCs differ from those metadata recorded for the path (DATA_LOSS:
  // the copy is not the file metadata knows, and storage serves it instead).
  // Nothing the peer says is taken on trust: the job, tag and path must be
  // valid names under the storage roots (else PERMISSION_DENIED), and the
  // owner is metadata's, or the job's owner once a client set its ring
  // here; a file with neither is refused (PERMISSION_DENIED).
  virtual Status AdoptRecovered(FileInfo f, std::unique_ptr<Buffer> mem) = 0;
  virtual void AbandonRecovery(std::unique_ptr<Buffer> mem) = 0;
  // Complete tags of `job` this node recorded before it was replaced, as
  // its successor held them (checked by the caller: valid, of `job`). Each
  // is kept unless one as new is recorded here, and told to metadata.
  // Returns how many were kept.
  virtual size_t AdoptTags(const std::string& job, std::vector<TagInfo> tags) = 0;
  // Whether a complete tag the ring gave back agrees with the files it
  // names: each is in memory here at the tag's size; or, not being one of
  // `listed` (the holder's copies of this node's files: those must be back),
  // it is another node's, and storage holds nothing else at its path
  // (nothing, or a file of the tag's size; storage that does not answer
  // cannot refuse). FAILED_PRECONDITION naming the first file that
  // disagrees: such a tag is not listed again.
  virtual Status CheckRecoveredTag(const TagInfo& tag, const std::set<std::string>& listed) = 0;
  // Files of `job` that metadata recorded here and that are not in memory
  // (after a restore: what the ring could not give back).
  virtual std::vector<FileInfo> NotInMemory(const std::string& job) = 0;

  // ---- peer reads ----
  // How many committed files of `job` this node holds in memory.
  virtual size_t InMemoryCount(const std::string& job) = 0;
  // For a ring member's read (ring/peer_server.h; the caller checked that
  // the peer is a member of the job's ring): the committed file (job, path)
  // this node holds in memory, its buffer pinned and a read-only fd in *fd
  // until EndPeerRead(out->buffer_id). NOT_FOUND if not in memory.
  virtual Status StartPeerRead(const std::string& job, const std::string& path, FileInfo* out, int* fd) = 0;
  // Ends a pin of StartPeerRead (or of PeerVersions' reads of a version's files).
  virtual void EndPeerRead(uint64_t buffer_id) = 0;
};

}  // namespace tce
