// BackupQueue: the ring's work, in the order it is done. Drops, tags and
// recoveries carry no file data and unblock peers, so they go first, in the
// order they came; then files to send, in commit order. The Cache feeds it
// (BackupFeed); Replicator workers take from it. Thread-safe.
#pragma once

#include <deque>
#include <variant>

#include "cache/backup_feed.h"
#include "common/mutex.h"

namespace tce {

class BackupQueue : public BackupFeed {
 public:
  // A FileKey is a file to send (RingBackups::StartBackup says what, if anything).
  using Job = std::variant<FileKey, DropCopy, RecoverJob, TagCopy, PersistedCopy>;

  void Send(const FileKey& key) override;
  void SendTag(TagCopy tag) override;
  void Drop(DropCopy drop) override;
  void Persisted(PersistedCopy copy) override;
  void Recover(RecoverJob recover) override;
  std::vector<FileKey> Waiting() const override;

  // Blocks for the next job; false once stopped.
  bool Next(Job* out);
  // Wakes every Next() with false, now and later.
  void Stop();

 private:
  mutable Mutex mu_;
  CondVar cv_;  // a job was queued, or stopping
  std::deque<Job> urgent_ GUARDED_BY(mu_);  // drops, tags, identities and recoveries
  std::deque<FileKey> sends_ GUARDED_BY(mu_);
  bool stopping_ GUARDED_BY(mu_) = false;
};

}  // namespace tce
