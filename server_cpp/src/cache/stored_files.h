// StoredFiles: files as storage holds them, for the RPC layer
// (rpc/service.h): whether a path is an object root's, the read of a file a
// load missed into the cache, ranged reads, deletes and listings of object
// storage, and where each job's loads took their bytes from.
//
// The StorageAccess is one (cache/storage_access.h). Thread-safe.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <string>
#include <vector>

#include "cache/cache_types.h"
#include "cache/load_split.h"
#include "common/status.h"
#include "storage/identity.h"  // ObjectId

namespace tce {

class StoredFiles {
 public:
  virtual ~StoredFiles() = default;

  // Whether `path` lies under an object storage root (a client cannot
  // read it itself).
  virtual bool IsObjectPath(const std::string& path) const = 0;
  // Whether a load of `path` that missed memory and the ring is read from
  // storage into the cache by this server (FetchFromStorage): an object
  // root's file always, a directory root's when CacheOptions::fetch_files says so.
  virtual bool FetchesOnMiss(const std::string& path) = 0;
  // A load that missed: brings the file at `path` (an object root's, or a
  // directory root's read as the session's user) into the cache as a
  // PERSISTED file of `job`, owned by the session's uid; one read at a
  // time per file, shared by the loads that ask meanwhile. NOT_FOUND when
  // storage has no such file, or this server reads no such path
  // (FetchesOnMiss); FAILED_PRECONDITION when the file reached the cache
  // meanwhile (look it up again).
  virtual Status FetchFromStorage(const std::string& session, const std::string& job, const std::string& path) = 0;
  // A load of `job` took `bytes` from `from` (counted per job: Status'
  // job_loads); where each job's loads took their bytes from so far: every
  // job's for an administrator, else the jobs of `uid`.
  virtual void NoteLoad(const std::string& job, LoadFrom from, uint64_t bytes) = 0;
  virtual std::vector<JobLoadSplit> LoadSplits(bool admin, uid_t uid) = 0;
  // Bytes [offset, offset + length) of the object at `path` (under an object
  // root), into `into` when given, else into `data`. `*id`: on entry, the
  // identity the caller pinned (etag and size; an empty etag: none), read
  // only while the object is still that one, with no look at it first;
  // FAILED_PRECONDITION, naming the object, when it was replaced or deleted
  // since. With none pinned, the object is looked up first. On success,
  // `*id` is the identity the bytes came from. NOT_FOUND: no such object;
  // OUT_OF_RANGE: past its end.
  virtual Status ReadObjectRange(const std::string& session, const std::string& job, const std::string& path,
                                 uint64_t offset, uint64_t length, std::string* data, unsigned char* into,
                                 ObjectId* id) = 0;
  // Deletes the object at `path` (under an object root) from storage; absent: OK.
  virtual Status DeleteObject(const std::string& session, const std::string& job, const std::string& path) = 0;
  // The files object storage holds under the directory `dir` (under an
  // object root), as PERSISTED files of `job` with their sizes, by path.
  // INVALID_ARGUMENT when `dir` is not under an object root.
  virtual Status ListStored(const std::string& session, const std::string& job, const std::string& dir,
                            std::vector<FileInfo>* out) = 0;
};

}  // namespace tce
