#include "cache/backups.h"

#include <chrono>
#include <utility>

#include "common/logging.h"

namespace tce {

Backups::Backups(BackupFeed* feed, BackupHost* host, Clock* clock)
    : feed_(feed), host_(host), loud_(1, std::chrono::minutes(1), clock) {}

bool Backups::StartBackup(const FileKey& key, BackupJob* out) {
  if (!host_->PinForBackup(key, out)) return false;
  MutexLock lock(&mu_);
  ++figures_.in_flight;
  return true;
}

void Backups::FinishBackup(const BackupJob& job, const Status& result) {
  host_->RecordBackup(job, result);
  MutexLock lock(&mu_);
  --figures_.in_flight;
  if (result.ok()) {
    ++figures_.backed_up_files;
    return;
  }
  ++figures_.failures;
  figures_.error = job.peer + ": " + result.ToString();
}

bool Backups::StartTagBackup(const TagCopy& copy, TagInfo* tag, std::string* peer, int32_t* node) {
  return host_->TagToSend(copy, tag, peer, node);
}

void Backups::ResendBackups(const std::string& job, const std::string& peer) {
  const size_t n = host_->ForgetHolder(job, peer);
  TCE_LOG(kInfo, "ring") << peer << " lost its copies of job=" << job << ": re-sending " << n << " file(s)";
}

void Backups::NoteBackupError(const std::string& message) { CountFailure(message); }

void Backups::CountFailure(const std::string& message) {
  MutexLock lock(&mu_);
  ++figures_.failures;
  figures_.error = message;
}

void Backups::NoteRingAttempt(const Status& result, const std::string& what) {
  uint64_t failing = 0;
  {
    MutexLock lock(&mu_);
    if (result.ok()) {
      figures_.failing = 0;
      return;
    }
    failing = ++figures_.failing;
  }
  // Each attempt is a warning of its own; a run of them means the node's
  // files have no copy on the next node, which an operator must hear of.
  uint64_t suppressed = 0;
  if (failing >= kFailingLoudly && loud_.Allow(&suppressed))
    TCE_LOG(kError, "ring") << "ring backups have failed " << failing
                            << " times in a row: files cached here have no copy on the next node "
                               "(a lost node loses them); last: "
                            << what << ": " << result.ToString() << Suppressed(suppressed);
}

void Backups::Send(const FileKey& key) {
  if (feed_) feed_->Send(key);
}

void Backups::SendTag(TagCopy tag) {
  if (feed_) feed_->SendTag(std::move(tag));
}

void Backups::Drop(const FileInfo& f) {
  if (f.backup_holder.empty() || !feed_) return;
  feed_->Drop(DropCopy{f.job, f.path, f.backup_holder, f.version});
}

void Backups::TellPersisted(const FileInfo& f) {
  if (!feed_ || f.backup_holder.empty() || !f.disk.written || f.disk.from_peer) return;
  feed_->Persisted(PersistedCopy{f.job, f.path, f.backup_holder, f.version, f.disk});
}

void Backups::Recover(RecoverJob recover) {
  if (feed_) feed_->Recover(std::move(recover));
}

std::vector<FileKey> Backups::Waiting() const { return feed_ ? feed_->Waiting() : std::vector<FileKey>(); }

BackupFigures Backups::Figures() const {
  MutexLock lock(&mu_);
  return figures_;
}

}  // namespace tce
