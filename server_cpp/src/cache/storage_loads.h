// StorageLoads: the ring's reads of storage into the cache (ring/
// replicator.h, ring/peer_server.h). In the cooperative restore each file
// of a tag is read from storage once, by one node of the ring, for every
// node (docs/ring.md): a node claims the files it reads, reads them as the
// job's owner, and hands them to the others from memory.
//
// The StorageAccess is one (cache/storage_access.h). Thread-safe.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "cache/load_split.h"
#include "common/status.h"
#include "storage/object_store.h"  // ListedObject

namespace tce {

class StorageLoads {
 public:
  virtual ~StorageLoads() = default;

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
