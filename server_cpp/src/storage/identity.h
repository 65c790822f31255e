// Identities on storage, and whether a name still holds the one recorded:
// what every storage root (a directory, a bucket) answers so that the cache
// never serves, nor persists over, a change the user made there (see
// docs/semantics.md and cache/storage_check.h). A file is told by its
// directory, inode, size and time; an object by its ETag and size.
//
// Nothing here follows a symlink below a storage root.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/status.h"
#include "env/env.h"

namespace tce {

// What a key of an object store holds: an object replaced or deleted since
// is told by its ETag or size.
struct ObjectId {
  bool exists = false;
  uint64_t size = 0;
  std::string etag;
  // The uid recorded as the object's owner (storage/object_owner.h); owned
  // false: none recorded.
  bool owned = false;
  uint32_t owner = 0;
  std::string written_by;  // the write that made it, as its store recorded it (empty: none)
};

// What a file's path held on storage, as this server last saw it: what was
// there when the save began, then the file this server wrote. A load or a
// persist that finds something else there knows the user removed or
// replaced it.
struct DiskIdentity {
  bool known = false;   // false: never checked (memory only, or storage did not answer)
  bool exists = false;  // a file was at the path
  bool written = false;  // that file is the one the save wrote (else: what was there before it)
  // From another node (a ring copy): device numbers are that node's own and
  // are left 0; inodes, sizes and times are the shared storage's.
  bool from_peer = false;
  uint64_t dev = 0, ino = 0, size = 0;  // that file
  int64_t mtime_ns = 0;
  uint32_t mode = 0;                    // its permission bits
  uint64_t dir_dev = 0, dir_ino = 0;    // the directory holding the path
  uint64_t parent_ino = 0;  // that directory's parent (0: unknown): tells a removed directory from other storage
  uint64_t seq = 0;  // orders identities the server recorded: the newest wins
  std::string etag;  // an object's (object storage roots; `size` is its size)
};

// What a save or a load records of an object key holding `o`.
DiskIdentity IdentityOf(const ObjectId& o);

// kSame: the name holds that identity (or still nothing, and its directory
// is the same directory); kChanged: the user removed or replaced it (a
// cached copy must not be served, a save not yet persisted is discarded);
// kUnavailable: storage cannot say (EIO, ESTALE, not mounted, no answer in
// time); kElsewhere (peer identities only): this is not the storage the
// other node wrote to.
enum class Verdict { kSame, kChanged, kUnavailable, kElsewhere };

struct StorageCheck {
  Verdict verdict = Verdict::kSame;
  std::string why;  // for kChanged and kUnavailable
};

// Compares `dir`, opened for `path`'s directory, with `expected`.
StorageCheck CheckDirectory(Directory* dir, const std::string& path, const DiskIdentity& expected);

// Compares the entry `name` of `dir` (the directory of `path`) with
// `expected`; `now` gets what is there (exists: whether anything is).
StorageCheck CheckEntry(Directory* dir, const std::string& path, const std::string& name,
                        const DiskIdentity& expected, FileStat* now, bool* exists);

// Classifies a failure to open `dir` (the directory of a path whose
// directory was `expected`): removed (kChanged) or storage not there
// (kUnavailable).
StorageCheck ClassifyOpenFailure(Env* env, const std::string& dir, const Status& error,
                                 const DiskIdentity& expected);

// Compares what an object key holds now (`now`) with `expected` (known);
// `url` names it in the verdict.
StorageCheck CompareObject(const std::string& url, const DiskIdentity& expected, const ObjectId& now);

// Whether `now` (what a read of the path found) is the very file `was`
// recorded as on storage (a save wrote it, or a load read it): the same
// object (ETag and size), or the same inode, size and modification time
// (and device, where `was` knows it: a peer's identity leaves it 0).
bool SameStoredFile(const DiskIdentity& was, const DiskIdentity& now);

// The identity of the file `st` written (or read) in the directory `dir`
// records (as `dir`, when that directory is unknown); `seq` is the caller's.
DiskIdentity FileIn(const DiskIdentity& dir, const FileStat& st);

// The directory of an absolute `path` ("/" for a file at the root).
std::string Dirname(const std::string& path);

// The longest of `roots` that `resolved` lies under, or null.
const std::string* RootOf(const std::string& resolved, const std::vector<std::string>& roots);

}  // namespace tce
