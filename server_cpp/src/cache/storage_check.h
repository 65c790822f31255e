// Storage checks: whether a file's path on storage still holds what the
// cache believes it holds, so that the cache never serves, nor persists over,
// a change the user made on disk (see docs/semantics.md).
//
// A path is compared with the DiskIdentity the server recorded for it: what
// was there when the save began (SnapshotPath), then the file the server
// wrote. The answer is one of:
//   kSame        the path holds that (or still nothing, and its directory is
//                the same directory);
//   kChanged     the user removed or replaced the file or its directory: the
//                cached copy must not be served, and a save not yet persisted
//                is discarded;
//   kUnavailable storage cannot say (EIO, ESTALE, a filesystem not mounted,
//                no answer in time): the cache is served.
// A directory that is missing is told apart from a filesystem that is not
// mounted by the device of its nearest existing ancestor: the same device as
// the directory had means it was removed.
//
// Nothing here follows a symlink below the storage root; every call is a
// filesystem call, made without the cache's lock.
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "cache/cache_types.h"
#include "common/clock.h"
#include "common/status.h"
#include "env/env.h"
#include "storage/identity.h"
#include "storage/storage_roots.h"

namespace tce {

// What `path` (absolute, normalised) holds now, into `out` (known = true).
// NOT_FOUND: its directory does not exist; PERMISSION_DENIED: it does not
// resolve under a directory root of `roots`, or a symlink or a file stands on the way;
// any other error: storage could not be read.
Status SnapshotPath(const StorageRoots& roots, const std::string& path, DiskIdentity* out);

// Compares what `path` holds now with `expected` (known).
StorageCheck CheckPath(const StorageRoots& roots, const std::string& path, const DiskIdentity& expected);

// Compares what `path` holds now with `theirs`, an identity another node
// recorded (a ring copy's: inodes, sizes and times; no device numbers).
// kSame: `now` gets this node's own identity of the path (known).
StorageCheck CheckPeerIdentity(const StorageRoots& roots, const std::string& path, const DiskIdentity& theirs,
                               DiskIdentity* now);

// Runs storage checks on threads of its own and waits for each at most a
// timeout, so that a hung filesystem (an NFS server that stopped answering)
// delays a load by that much and no more. A check that overruns keeps its
// thread; when `max_stuck` threads are stuck, Run fails at once.
class Prober {
 public:
  // Timeouts are measured on `clock`.
  explicit Prober(std::chrono::milliseconds timeout, Clock* clock = Clock::Real(), int max_stuck = 8);
  ~Prober();
  Prober(const Prober&) = delete;
  Prober& operator=(const Prober&) = delete;

  // Runs `fn` (which must own everything it touches: it may outlive the
  // call); false when it did not finish within the timeout. A timeout <= 0
  // runs it on the caller's thread.
  bool Run(std::function<void()> fn);

 private:
  struct Core;
  const std::chrono::milliseconds timeout_;
  Clock* const clock_;
  const int max_stuck_;
  std::shared_ptr<Core> core_;
};

}  // namespace tce
