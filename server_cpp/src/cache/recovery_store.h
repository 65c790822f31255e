// RecoveryStore: the Cache as the ring brings files back into it
// (ring/replicator.h, ring/peer_server.h): this node's own files and tags
// pulled back from the ring after a restart or a node's loss, and the
// cooperative restore, where each file of a tag is read from storage once,
// by one node of the ring, for every node (docs/ring.md).
//
// Trust: what a peer hands back is checked on adoption (AdoptRecovered,
// CheckRecoveredTag), never taken on its word.
//
// The Cache is one. Thread-safe.
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

class RecoveryStore {
 public:
  virtual ~RecoveryStore() = default;

  // ---- recovery: this node's files and tags back from the ring ----
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

  // ---- cooperative restore: a tag read from storage once (docs/ring.md) ----
  // Whether `path` lies under a storage root (a directory or object root).
  virtual bool UnderStorage(const std::string& path) = 0;
  // Reads (job, path) from storage into the cache as the job's owner (once
  // a client set its ring here: NOT_FOUND before), unless it is in memory already
  // (OK); once at a time per file, every other load waits for that read.
  // `for_peer`: another node's plan named this one (counted apart).
  virtual Status LoadFromStorage(const std::string& job, const std::string& path, bool for_peer) = 0;
  // The files directly in `dir` on storage, with their sizes (as the job's
  // owner, for a directory root).
  virtual Status ListStorageDir(const std::string& job, const std::string& dir, std::vector<ListedObject>* out) = 0;
  // A load of `job` took `bytes` from `from`.
  virtual void NoteLoad(const std::string& job, LoadFrom from, uint64_t bytes) = 0;
  // As the file's node in the restore plan: the node that reads (job,
  // path) from storage for the ring, the first one named (for a while),
  // else `node` from now on.
  virtual std::string ClaimRead(const std::string& job, const std::string& path, const std::string& node) = 0;
  // `node` stopped answering: its claims on the job's files are dropped
  // (the next node that asks reads them). Returns how many.
  virtual size_t DropClaims(const std::string& job, const std::string& node) = 0;
};

}  // namespace tce
