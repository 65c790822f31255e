// Cache: coherence with storage (docs/semantics.md). What a save's path
// holds when it begins, what the persister left there, and the verdict of
// comparing a cached file with storage before it serves a load.
#include "cache/cache.h"

#include "cache/storage_check.h"
#include "common/logging.h"

namespace tce {

Status Cache::SnapshotFor(const std::string& session, const std::string& path, DiskIdentity* out) {
  if (!persistence_enabled()) return Status::OK();  // memory only: a path is a name
  std::string key;
  if (const ObjectRoot* root = storage_->ObjectRootOf(path, &key)) {
    Requester who;
    Status s = SessionRequester(session, &who);
    return s.ok() ? SnapshotObject(*root, key, path, who, out) : s;
  }
  // Numbered before looking, so an identity this server records later (a
  // write that lands meanwhile) is known to be newer.
  const uint64_t seq = ++disk_seq_;
  auto result = std::make_shared<std::pair<Status, DiskIdentity>>();
  std::shared_ptr<const StorageRoots> roots = storage_;
  std::string p = path;
  if (!prober_->Run([=] { result->first = SnapshotPath(*roots, p, &result->second); })) {
    NoteStorageFallback(path, "storage did not answer in time; the save goes on unchecked");
    return Status::OK();
  }
  const Status& s = result->first;
  if (s.code() == Status::Code::kNotFound || s.code() == Status::Code::kPermissionDenied ||
      s.code() == Status::Code::kFailedPrecondition)
    return s;  // as torch.save would fail: no such directory, or not a file
  if (!s.ok()) {
    NoteStorageFallback(path, s.ToString() + "; the save goes on unchecked");
    return Status::OK();
  }
  *out = result->second;
  out->seq = seq;
  return Status::OK();
}

void Cache::NoteStorageFallback(const std::string& path, const std::string& why) {
  ++storage_fallbacks_;
  uint64_t dropped = 0;
  if (storage_log_.Allow(&dropped))
    TCE_LOG(kWarning, "cache") << "storage could not be checked for " << path << ": " << why
                               << Suppressed(dropped);
}

DiskIdentity Cache::Written(const DiskIdentity& before, const FileStat& st) {
  DiskIdentity d = FileIn(before, st);
  if (before.known) d.seq = ++disk_seq_;
  return d;
}

void Cache::LetGo(FileInfo& f, FileState state, const std::string& why) {
  ReleaseBuffer(f.buffer_id);
  QueueDrop(f);
  persistence_->CancelRetry({f.job, f.path});
  f.state = state;
  f.reason = why;
  f.buffer_id = 0;
  f.capacity = 0;
  f.backup_holder.clear();
  Note(f, false);
  done_cv_.SignalAll();
}

void Cache::Discard(FileInfo& f, const std::string& why) {
  TCE_LOG(kWarning, "cache") << "DISCARDED job=" << f.job << " tag=" << f.tag << " path=" << f.path
                             << ": " << why << " (the save is dropped, never persisted)";
  ++counts_.discarded_files;
  LetGo(f, FileState::kDiscarded, why);
}

void Cache::DropStale(FileInfo& f, const std::string& why) {
  TCE_LOG(kInfo, "cache") << "dropped the cached copy of job=" << f.job << " path=" << f.path << ": "
                          << why << " (loads read storage)";
  ++counts_.stale_drops;
  LetGo(f, FileState::kEvicted, why);
}

void Cache::Revalidate(const FileKey& key) {
  DiskIdentity expected;
  uint64_t version = 0;
  {
    MutexLock lock(&mu_);
    auto it = files_.find(key);
    if (it == files_.end() || it->second.buffer_id == 0 || !it->second.disk.known ||
        it->second.state == FileState::kPending)
      return;
    // Being written now: the path changes under our own hand (the persister
    // makes the same check itself just before its rename).
    if (persistence_->InFlightAt(key, it->second.version)) return;
    expected = it->second.disk;
    version = it->second.version;
  }
  auto result = std::make_shared<StorageCheck>();
  std::shared_ptr<const StorageRoots> roots = storage_;
  std::string path = key.second;
  StorageCheck c;
  std::string object_key;
  if (const ObjectRoot* root = storage_->ObjectRootOf(path, &object_key))
    c = CheckObject(*root, object_key, expected);
  else if (prober_->Run([=] { *result = CheckPath(*roots, path, expected); }))
    c = *result;
  else
    c = {Verdict::kUnavailable, "storage did not answer within " + std::to_string(check_timeout_.count()) + " ms"};
  if (c.verdict == Verdict::kSame) return;
  MutexLock lock(&mu_);
  auto it = files_.find(key);
  if (it == files_.end() || it->second.version != version || it->second.buffer_id == 0) return;
  if (it->second.disk.seq != expected.seq || persistence_->InFlight(key)) return;  // we wrote it meanwhile
  if (c.verdict == Verdict::kUnavailable) {
    NoteStorageFallback(key.second, c.why + "; the cached copy is served");
  } else if (it->second.state == FileState::kPersisted) {
    DropStale(it->second, c.why);
  } else {
    Discard(it->second, c.why);
  }
}

}  // namespace tce
