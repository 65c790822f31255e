// Backups: the cache's side of backing its files up around the ring
// (docs/architecture.md). It serves the ring's workers through RingBackups,
// queues the ring's work on the BackupFeed it is built with
// (ring/backup_queue.h), and keeps what is backups' own: the backups in
// flight, the files backed up, the failures (all, and in a row) and the
// last error.
//
// The file table, the ring table and the buffers are the Cache's, asked
// through BackupHost, each host call one step under the Cache's lock (a
// file's checks and its pin are one step, so an eviction or a new version
// never falls between them).
//
// Locks: its own `mu_` is a leaf: the Cache calls the methods "for the
// Cache" with its lock held, and Backups never holds `mu_` while it calls
// the host or the feed. Order: the Cache's lock, then Backups', then the
// feed's. Thread-safe.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "cache/backup_feed.h"
#include "cache/cache_types.h"
#include "cache/ring_backups.h"
#include "common/clock.h"
#include "common/log_limiter.h"
#include "common/mutex.h"
#include "common/status.h"

namespace tce {

// What Backups asks of the node's cache. Each call takes the cache's lock;
// none holds Backups' lock.
class BackupHost {
 public:
  virtual ~BackupHost() = default;
  // RingBackups::StartBackup as one step: the current version of `key`
  // (to the job's successor, not held there yet) pinned in `out` with a
  // read-only fd, or false. `out->data` is mapped after the step.
  virtual bool PinForBackup(const FileKey& key, BackupJob* out) = 0;
  // RingBackups::FinishBackup as one step: the buffer unpinned; a failed
  // backup of the current version queued again, a successful one recorded
  // on the file (its holder, BACKED_UP). Returns nothing: Backups counts.
  virtual void RecordBackup(const BackupJob& job, const Status& result) = 0;
  // RingBackups::StartTagBackup.
  virtual bool TagToSend(const TagCopy& copy, TagInfo* tag, std::string* peer, int32_t* node) = 0;
  // `peer` lost the copies of `job`: the files it held are queued again
  // (and the job's tags, when it is the successor); how many files.
  virtual size_t ForgetHolder(const std::string& job, const std::string& peer) = 0;
};

// Backups' figures for CacheStats.
struct BackupFigures {
  uint64_t in_flight = 0;                   // backups being sent now
  uint64_t backed_up_files = 0, failures = 0;  // since start
  uint64_t failing = 0;                     // attempts failed in a row
  std::string error;                        // the last failure
};

class Backups : public RingBackups {
 public:
  // A run of this many failed attempts in a row is logged as an error.
  static constexpr uint64_t kFailingLoudly = 3;

  // `feed`: where the ring's work is queued (null: nowhere, nothing is
  // backed up). The feed and the host outlive it.
  Backups(BackupFeed* feed, BackupHost* host, Clock* clock = Clock::Real());
  Backups(const Backups&) = delete;
  Backups& operator=(const Backups&) = delete;

  // ---- RingBackups (cache/ring_backups.h) ----
  bool StartBackup(const FileKey& key, BackupJob* out) override EXCLUDES(mu_);
  void FinishBackup(const BackupJob& job, const Status& result) override EXCLUDES(mu_);
  bool StartTagBackup(const TagCopy& copy, TagInfo* tag, std::string* peer, int32_t* node) override;
  void ResendBackups(const std::string& job, const std::string& peer) override;
  void NoteBackupError(const std::string& message) override EXCLUDES(mu_);
  void NoteRingAttempt(const Status& result, const std::string& what) override EXCLUDES(mu_);

  // ---- for the Cache (with its lock held, or none) ----
  // Whether work is queued anywhere (a feed was given).
  bool feeding() const { return feed_ != nullptr; }
  // The feed's five kinds of work; nothing without a feed.
  void Send(const FileKey& key);
  void SendTag(TagCopy tag);
  // `f`'s copy on its holder is no longer wanted (none: nothing).
  void Drop(const FileInfo& f);
  // `f` is persisted: its holder is told what storage holds (nothing unless
  // it has a holder and was written by this node).
  void TellPersisted(const FileInfo& f);
  void Recover(RecoverJob recover);
  // The files waiting to be sent, in order (not those in flight).
  std::vector<FileKey> Waiting() const;
  BackupFigures Figures() const EXCLUDES(mu_);

 private:
  // Counts a failure, with its message as the last error.
  void CountFailure(const std::string& message) EXCLUDES(mu_);

  BackupFeed* const feed_;
  BackupHost* const host_;
  mutable Mutex mu_;  // a leaf: see the header comment
  BackupFigures figures_ GUARDED_BY(mu_);
  LogLimiter loud_;  // the run of failures' error lines (thread-safe)
};

}  // namespace tce
