// ObjectStore: the storage interface every storage root is written and read
// through: a name (key) holds a whole file's bytes, written durably and
// visible only complete, with an identity coherence compares
// (storage/identity.h). Directory roots are PosixStores (temp file, fsync,
// rename, beneath the root without following symlinks), object roots
// S3Stores; ObjectRoots maps path prefixes to object stores: with
// `storage_roots = /ckpt=s3://bucket/run1`, the file /ckpt/a/x.pt is the
// object run1/a/x.pt of bucket `bucket`, holding exactly the file's bytes.
//
// A new backend is one class implementing ObjectStore plus one line in
// OpenObjectStore (object_roots.cc), chosen by the URL's scheme. Stores are
// thread-safe.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <thread>
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

// Settings every store may use (daemon/settings.cc: the s3_* settings).
struct ObjectStoreOptions {
  std::string endpoint, region = "us-east-1", ca_file, credentials_file, profile = "default";
  bool path_style = false, verify_tls = true;
  uint64_t part_size = 8 << 20;    // multipart above this, in parts this size
  uint64_t range_size = 32 << 20;  // ranged reads of this size
  int parallel = 10, retries = 8;
  int backoff_ms = 100;
  int request_timeout_ms = 120000;  // one request, its retries included
  std::string checksum = "crc32";  // what the store checks each body with: crc32, md5 or none
  // The directory where unfinished writes are journaled (a file per store),
  // so a restart abandons them (empty: not journaled).
  std::string journal;
  // Filesystems (file://): the Env every call goes through, the bytes per
  // write(), O_DIRECT where the filesystem allows it, O_DIRECT writes in
  // flight per file, and the prefix of named temp files (one per server).
  Env* env = nullptr;
  size_t chunk = 16 << 20;
  bool direct_io = true;
  int io_depth = 4;
  std::string temp_prefix = ".tce-";
};

// Opens the store `url` ("s3://bucket[/prefix]", "file:///dir") names;
// `prefix` gets the key prefix ("" or "run1/"). INVALID_ARGUMENT for an
// unknown scheme.
Status OpenObjectStore(const std::string& url, const ObjectStoreOptions& options,
                       std::shared_ptr<ObjectStore>* out, std::string* prefix);

struct ObjectRoot {
  std::string dir;     // absolute, normalised, no trailing slash
  std::string url;     // as configured
  std::string prefix;  // key prefix: "" or ending in '/'
  std::shared_ptr<ObjectStore> store;
};

class ObjectRoots {
 public:
  ObjectRoots() = default;
  ObjectRoots(const ObjectRoots&) = delete;
  ObjectRoots& operator=(const ObjectRoots&) = delete;
  ~ObjectRoots() { CancelAll(); }
  void Add(ObjectRoot root) { roots_.push_back(std::move(root)); }
  bool empty() const { return roots_.empty(); }
  const std::vector<ObjectRoot>& all() const { return roots_; }
  // The root `path` (absolute, normalised) lies under (the longest), and its
  // key; null when none. Lexical: an object root has no directories to
  // resolve, and `..` was refused before.
  const ObjectRoot* Find(const std::string& path, std::string* key) const;
  // At start, on a thread of its own (an endpoint that is down must not
  // hold the server's start): each store abandons what a crash left.
  void AbandonUnfinishedInBackground();
  // Ends every transfer in progress and the background abandoning.
  void CancelAll();

 private:
  std::vector<ObjectRoot> roots_;
  std::thread abandoning_;
};

// Opens the stores of `objects` (dir, url) into `out`.
Status OpenObjectRoots(const std::vector<std::pair<std::string, std::string>>& objects,
                       const ObjectStoreOptions& options, std::shared_ptr<ObjectRoots>* out);

// Whether `path` names a tag's completeness marker: DCP's `.metadata`,
// DeepSpeed's `latest`. Written to object storage after the tag's other
// files, deleted before them.
bool IsTagMarker(const std::string& path);

// Splits `storage_roots` ("DIR" or "DIR=URL", comma-separated) into
// filesystem roots and object roots (URL checked, stores not opened).
Status ParseStorageRoots(const std::string& text, std::vector<std::string>* dirs,
                         std::vector<std::pair<std::string, std::string>>* objects);

}  // namespace tce
