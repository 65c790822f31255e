// RingBackups: this node's backups as the ring's workers see them
// (ring/replicator.h takes the files and tags to send and reports how it
// went; ring/peer_server.h hears that a peer lost the copies it held). The
// work itself is queued on the BackupFeed (cache/backup_feed.h) the Cache
// is built with. Served by the Cache's Backups component (cache/backups.h).
//
// Thread-safe: the backup workers and the peer port's connection threads
// call it at once.
#pragma once

#include <cstdint>
#include <string>

#include "cache/backup_feed.h"
#include "cache/buffer.h"
#include "cache/cache_types.h"
#include "common/status.h"

namespace tce {

class RingBackups {
 public:
  virtual ~RingBackups() = default;
  // For backup workers: the current version of `key` to send to the job's
  // successor, pinned (until FinishBackup), in `out`; false when there is
  // nothing to send (no successor, not in memory, already held there).
  virtual bool StartBackup(const FileKey& key, BackupJob* out) = 0;
  // Records the outcome. A failed backup is queued again (the worker backs
  // off); the file itself is unaffected.
  virtual void FinishBackup(const BackupJob& job, const Status& result) = 0;
  // For backup workers: the complete tag `copy` names, the job's successor
  // to send it to and this node's rank in the ring; false when there is
  // nothing to send (no successor, no such tag).
  virtual bool StartTagBackup(const TagCopy& copy, TagInfo* tag, std::string* peer, int32_t* node) = 0;
  // `peer` lost the copies it held for us: send the job's files again.
  virtual void ResendBackups(const std::string& job, const std::string& peer) = 0;
  // Counts a ring failure that belongs to no queued job (shown in Stats).
  virtual void NoteBackupError(const std::string& message) = 0;
  // The outcome of one attempt of the backup workers (a backup, a tag, a
  // drop or a restore) with the next node: a run of failures
  // (Backups::kFailingLoudly or more) is logged as an error (at most once a
  // minute); any success ends the run (Stats' backup_failing).
  virtual void NoteRingAttempt(const Status& result, const std::string& what) = 0;
};

}  // namespace tce
