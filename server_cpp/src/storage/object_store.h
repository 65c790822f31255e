// ObjectStore: the storage interface every storage root is written and read
// through: a name (key) holds a whole file's bytes, written durably and
// visible only complete, with an identity coherence compares
// (storage/identity.h). Directory roots are PosixStores (temp file, fsync,
// rename, beneath the root without following symlinks), object roots
// S3Stores; StorageRoots (storage/storage_roots.h) maps a path to its store
// and key: with `storage_roots = /ckpt=s3://bucket/run1`, the file
// /ckpt/a/x.pt is the object run1/a/x.pt of bucket `bucket`, holding
// exactly the file's bytes.
//
// Each backend is a class implementing this interface with options of its
// own, opened by the URL's scheme through the table of storage/backends.h
// (which docs/architecture.md, "Adding a storage backend", walks through,
// with the order in which the server calls each method). Stores are
// thread-safe.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "common/status.h"
#include "env/env.h"
#include "storage/identity.h"
#include "storage/object_owner.h"

namespace tce {

struct ListedObject {
  std::string key;
  uint64_t size = 0;
};

// How one Write goes.
struct WriteOptions {
  // Runs before the bytes below `end` are first read, from any of the
  // store's threads (the persister patches CRCs in there, and yields to
  // saves in flight); optional.
  std::function<void(uint64_t end)> prepare;
  // The last look, just before the new bytes become visible (a failure
  // abandons the write and is returned); optional.
  std::function<Status()> before_commit;
  // What the save found at the key (known): the write goes ahead only while
  // the key (and, on a filesystem, its directory) still holds that, else
  // CANCELLED with the reason (UNAVAILABLE when storage cannot say). Null
  // or not known: nothing is compared.
  const DiskIdentity* expected = nullptr;
  // Names this version of the file (the persister: its version number):
  // object stores record it with the object, and an object found at the key
  // that carries it is this very write, landed by an earlier attempt whose
  // answer was lost: the write is done, not a change by another writer.
  std::string write_id;
  // The uid that saved the file: filesystems write as it (a root server
  // only; -1: the server's own), object stores record it as the object's
  // owner and write over only an object of its own or with no owner (uid 0
  // over any: the save's own check applied root_is_admin). Filesystems
  // also: the gid written as, a new file's permission bits (a replaced file
  // keeps its own), whether missing directories are made, and how many
  // bytes of `data` may be read (>= n, a multiple of 4096 for O_DIRECT).
  uint32_t uid = static_cast<uint32_t>(-1), gid = static_cast<uint32_t>(-1);
  uint32_t new_mode = 0644;
  bool create_dirs = false;
  uint64_t readable = 0;
};

class ObjectStore {
 public:
  virtual ~ObjectStore() = default;
  // "s3://bucket/key", for messages and logs (never credentials).
  virtual std::string Url(const std::string& key) const = 0;
  // Whether the store can hold `key` at all (S3: at most 1024 bytes), so a
  // save it could never persist is refused when it begins (INVALID_ARGUMENT
  // naming the limit).
  virtual Status CheckKey(const std::string& key) const = 0;
  // Writes data[0, n) at `key` durably, visible only once complete (never
  // a partial file or object), as `options` says. `out`: what the key holds
  // now (a file's stat; an object's size and ETag).
  virtual Status Write(const std::string& key, const char* data, uint64_t n, const WriteOptions& options,
                       FileStat* out) = 0;
  // Whether a failed Write is worth trying again at once (the store has
  // retried what clears quickly itself); false leaves the file FAILED, to
  // be persisted again later when the failure may clear (a deadline).
  virtual bool Retryable(const Status& s) const = 0;
  // Reads [offset, offset + n) of `key` into `into` (large reads as ranged
  // reads in parallel). A non-empty `etag` must still be the object's
  // (FAILED_PRECONDITION when it was replaced meanwhile). Object stores
  // write no byte of another owner's object into `into` (MayUse: refused
  // on the answer's metadata, before its body); directory roots' reads go
  // through the kernel as the user instead (cache/cache_fetch.cc).
  virtual Status Read(const std::string& key, uint64_t offset, uint64_t n, char* into, const std::string& etag,
                      const Requester& who) = 0;
  // Absent: OK, exists = false; an object's owner is in `out`.
  virtual Status Stat(const std::string& key, ObjectId* out) = 0;
  // The keys under `prefix` that `who` may read (object stores: another
  // owner's are left out).
  virtual Status List(const std::string& prefix, const Requester& who, std::vector<ListedObject>* out) = 0;
  // Absent: OK; another owner's object: PERMISSION_DENIED (object stores).
  virtual Status Delete(const std::string& key, const Requester& who) = 0;
  // At start: abandons the unfinished writes a crashed run of this server
  // left (only its own); returns how many.
  virtual int AbandonUnfinished() = 0;
  // Ends every wait and transfer in progress (the server is stopping).
  virtual void Cancel() = 0;
  virtual uint64_t retries() const = 0;  // requests retried so far
};

}  // namespace tce
