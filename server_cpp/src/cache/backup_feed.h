// BackupFeed: how the Cache hands work to the ring (ring/backup_queue.h).
//
// Five kinds of job, each its own type: a file's current version to send
// to the job's ring successor (named by its key; the worker asks the Cache
// for the version when it gets to it, RingBackups::StartBackup, and gets a
// BackupJob), a complete tag to send there too (TagCopy, likewise named:
// RingBackups::StartTagBackup), a copy a peer must let go of (DropCopy), the
// storage identity of a copy's file once persisted (PersistedCopy), and a job
// whose files and tags this node pulls back from the ring (RecoverJob). The Cache calls these with
// its lock held: an implementation takes only its own lock and never calls
// back into the Cache. Any thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "cache/cache_types.h"   // DiskIdentity
#include "cache/persist_feed.h"  // FileKey

namespace tce {

// `peer` holds a copy of (job, path) at `version` that is no longer wanted
// (the file was evicted, removed or replaced).
struct DropCopy {
  std::string job, path, peer;
  uint64_t version = 0;
};

// `peer` holds a copy of (job, path) at `version`, which this server has
// since written to storage as `disk`: the holder keeps it with the copy, so
// that whoever pulls the copy back can tell whether storage changed since.
struct PersistedCopy {
  std::string job, path, peer;
  uint64_t version = 0;
  DiskIdentity disk;
  int failures = 0;  // attempts that failed so far
};

// The complete tag (job, tag) this server recorded, for the job's successor
// to hold: a replacement of this node gets it back with the files.
struct TagCopy {
  std::string job, tag;
};

// This node (`node` in the job's ring) holds nothing of `job`: pull its
// copies back from `peer` (the successor), then ask `predecessor` to back up
// to us again.
struct RecoverJob {
  std::string job;
  int32_t node = 0;
  std::string peer, predecessor;
  int failures = 0;  // attempts that failed so far
};

class BackupFeed {
 public:
  virtual ~BackupFeed() = default;
  virtual void Send(const FileKey& key) = 0;
  virtual void SendTag(TagCopy tag) = 0;
  virtual void Drop(DropCopy drop) = 0;
  virtual void Persisted(PersistedCopy copy) = 0;
  virtual void Recover(RecoverJob recover) = 0;
  // The files waiting to be sent, in order (not those being sent).
  virtual std::vector<FileKey> Waiting() const = 0;
};

}  // namespace tce
