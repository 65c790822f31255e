// Cache: recovery's side, the files and tags the ring gives back to a
// restarted or replaced node (ring/replicator.h pulls them, through the
// Recovery component, cache/recovery.h), and this node's files in memory
// as peers read them. Each copy is checked like a save (by Recovery) and
// against what this server knows (metadata, the job's owner) and against
// storage: a copy never undoes storage, nor is written over a file it does
// not record (docs/ring.md). Loads of the job wait for the restore.
#include "cache/cache.h"

#include <algorithm>

#include "common/logging.h"

namespace tce {

size_t Cache::AdoptTags(const std::string& job, std::vector<TagInfo> tags) {
  MutexLock lock(&mu_);  // as CommitTag: RecordAll sees a tag here or in the registry
  size_t kept = 0;
  for (TagInfo& t : tags) {
    if (t.job != job) continue;
    const std::string name = t.tag;
    TagInfo before;
    const bool had = tags_.Find(job, name, &before);
    if (!tags_.Adopt(std::move(t))) continue;
    CountTag(had ? &before : nullptr, job, name);
    ++kept;
    TagInfo recorded;  // with the version it got here
    if (meta_ && tags_.Find(job, name, &recorded)) meta_->RecordTag(recorded);
  }
  if (kept) TrimTags(job);
  if (kept) publication_->Changed();
  return kept;
}

std::vector<size_t> Cache::TagFilesNotHeld(const TagInfo& tag) {
  MutexLock lock(&mu_);
  std::vector<size_t> out;
  for (size_t i = 0; i < tag.files.size(); ++i) {
    auto it = files_.find({tag.job, tag.files[i].path});
    const bool held = it != files_.end() && it->second.buffer_id != 0 && it->second.size == tag.files[i].size &&
                      it->second.state != FileState::kPending && it->second.state != FileState::kEvicted &&
                      it->second.state != FileState::kDiscarded;
    if (!held) out.push_back(i);
  }
  return out;
}

bool Cache::ProbePath(const std::string& path, Status* status, DiskIdentity* now) {
  auto result = std::make_shared<std::pair<Status, DiskIdentity>>();
  std::shared_ptr<const StorageRoots> roots = storage_;
  std::string p = path;
  if (!prober_->Run([=] { result->first = SnapshotPath(*roots, p, &result->second); })) return false;
  *status = result->first;
  *now = result->second;
  return true;
}

Status Cache::ReserveRecovery(uint64_t size, std::unique_ptr<Buffer>* out) {
  MutexLock lock(&mu_);
  const uint64_t capacity = RoundForBacking(Buffer::CapacityFor(size), backing_);
  if (capacity > budget_)  // never fits: evicting everything first would not help
    return Status::ResourceExhausted("a file of " + std::to_string(size) + " bytes does not fit in the memory budget (" +
                                     std::to_string(budget_) + " bytes)");
  std::vector<uint64_t> ignored;
  while (Held() + capacity > budget_) {
    Reclaim("", capacity, &ignored);
    if (Held() + capacity <= budget_) break;
    if (!EvictOne()) return Status::ResourceExhausted(FullMessage(capacity));
  }
  const uint64_t id = next_buffer_id_++;
  reserved_ += capacity;
  lock.Unlock();
  Status s = NewBuffer(id, capacity, out);  // the pool's, on the cache's pages
  if (!s.ok()) {
    lock.Lock();
    reserved_ -= capacity;
  }
  return s;
}

void Cache::AbandonRecovery(std::unique_ptr<Buffer> mem) {
  if (!mem) return;
  MutexLock lock(&mu_);
  reserved_ -= mem->capacity();
  if (auto lent = lent_readers_.find(mem->id()); lent != lent_readers_.end()) {  // a reused buffer goes
    OweUnmaps(lent->second, mem->id());
    lent_readers_.erase(lent);
  }
}

Status Cache::AdoptRecovered(FileInfo f, std::unique_ptr<Buffer> mem, const StorageCheck& storage,
                             const DiskIdentity& here) {
  // Its names were checked (by Recovery), and storage asked (CheckRecovered);
  // now against what this server knows (its metadata, the ring's owner): a
  // peer never names an owner or a size of its own choosing.
  MutexLock lock(&mu_);
  reserved_ -= mem->capacity();
  FileKey key{f.job, f.path};
  auto it = files_.find(key);
  if (it != files_.end() && it->second.buffer_id != 0)
    return Status::FailedPrecondition(f.path + " was saved again meanwhile: the newer copy stays");
  if (it != files_.end()) {  // known from metadata: size, owner and CRCs are metadata's
    const FileInfo& known = it->second;
    if (known.size != 0 && known.size != f.size) {
      return Status::DataLoss("the ring's copy of " + f.path + " has " + std::to_string(f.size) +
                              " bytes, metadata " + std::to_string(known.size) + ": storage serves it");
    }
    for (const Record& k : known.records) {
      if (k.crc32 == 0 && k.size > 0) continue;  // never checksummed (not persisted)
      auto same = std::find_if(f.records.begin(), f.records.end(),
                               [&](const Record& r) { return r.name == k.name; });
      if (same == f.records.end() || same->crc32 != k.crc32 || same->size != k.size) {
        return Status::DataLoss("the ring's copy of " + f.path + " does not match the checksums in "
                                "metadata (record " + k.name + "): storage serves it");
      }
    }
    f.owner_uid = known.owner_uid;
    f.owner_gid = known.owner_gid;
  } else {  // unknown here: it belongs to the job's owner, who set its ring (or let root set it)
    Status owner = JobOwnerIdsLocked(f.job, &f.owner_uid, &f.owner_gid);
    if (!owner.ok())
      return Status::PermissionDenied("the ring's copy of " + f.path + " is refused: " + owner.message() +
                                      (owner.code() == Status::Code::kNotFound
                                           ? " (its ring came from metadata, which does not know the file)"
                                           : ""));
  }
  // Written to storage: by the owner as the copy says, or by this server as
  // its metadata says.
  const bool written = f.disk.written || (it != files_.end() && (it->second.state == FileState::kPersisted ||
                                                                it->second.state == FileState::kEvicted));
  const bool on_storage = written && storage.verdict == Verdict::kSame;  // these very bytes: not written again
  if (persistence_enabled()) {
    std::string stale;
    if (it != files_.end() && it->second.state == FileState::kDiscarded)
      stale = "its save was discarded here (" + it->second.reason + ")";
    else if (storage.verdict == Verdict::kChanged)
      stale = storage.why;
    else if (written && storage.verdict == Verdict::kSame && !f.disk.written)
      stale = "this server wrote the file after the copy was made: storage holds what is newest";
    else if (written && !f.disk.known)
      stale = "the copy does not say what storage held (an older peer): storage serves the file";
    if (!stale.empty()) return RefuseStaleCopy(key, f, stale);
    // A copy to be persisted goes only where storage holds nothing, or the
    // very file the copy records (what its save found there): never over a
    // file it knows nothing of (a copy with no identity, another disk).
    if (!on_storage && storage.verdict == Verdict::kUnavailable)
      return Status::Aborted("the ring's copy of " + f.path + " is not restored: storage could not say what " +
                                 "it holds there (" + storage.why + "); the ring keeps the copy");
    if (!on_storage && storage.verdict == Verdict::kElsewhere && here.known && here.exists)
      return RefuseStaleCopy(key, f, "storage holds a file at " + f.path + " that the copy does not record (" +
                             storage.why + ")", "is not written over storage");
  }
  Buf& buf = Install(std::move(mem));
  const uint64_t id = buf.id;
  buf.state = BufState::kCached;
  buf.uid = f.owner_uid;
  f.buffer_id = id;
  f.capacity = buf.capacity;
  f.state = FileState::kBackedUp;
  f.version = next_allocation_id_++;
  f.committed_unix_ns = clock_->UnixNowNs();
  f.reason.clear();
  // Storage as this node sees it now: a later load or persist compares
  // with it (a persist writes only while the path still holds that). No
  // directory there (a replaced node's new disk): the persist makes it.
  f.disk = here.known ? here : DiskIdentity();
  if (on_storage) {
    f.state = FileState::kPersisted;  // storage holds these very bytes
    f.disk.written = true;  // and says so to a node that pulls them from here (never writes them again)
    if (f.persisted_unix_ns == 0) f.persisted_unix_ns = f.committed_unix_ns;
  }
  files_[key] = f;
  Note(f, false);
  if (f.state != FileState::kPersisted) QueuePersist(key);  // it may never have reached storage
  TCE_LOG(kInfo, "ring") << "recovered job=" << f.job << " path=" << f.path << " size=" << f.size
                         << " from " << f.backup_holder;
  return Status::OK();
}

StorageCheck Cache::CheckRecovered(const FileInfo& f, DiskIdentity* here) {
  if (!persistence_enabled()) return {Verdict::kElsewhere, "nothing to compare"};
  std::string key;
  if (const ObjectRoot* root = storage_->ObjectRootOf(f.path, &key)) {
    if (!f.disk.known) {  // what the bucket holds, to compare with nothing
      ObjectId now;
      Status s = ProbeObject(*root, key, &now);
      if (!s.ok()) return {Verdict::kUnavailable, s.ToString()};
      *here = IdentityOf(now);
      return {Verdict::kElsewhere, "the copy says nothing of what storage held"};
    }
    // The object the copy's node read or wrote (its ETag), or the key
    // empty as its save found it: still so in the bucket.
    StorageCheck c = CheckObject(*root, key, f.disk);
    if (c.verdict == Verdict::kSame) {
      *here = f.disk;
      here->from_peer = false;
    }
    return c;
  }
  auto result = std::make_shared<std::pair<StorageCheck, DiskIdentity>>();
  std::shared_ptr<const StorageRoots> roots = storage_;
  DiskIdentity theirs = f.disk;
  std::string path = f.path;
  if (!prober_->Run([=] {
        if (theirs.known) {
          result->first = CheckPeerIdentity(*roots, path, theirs, &result->second);
          return;
        }
        // Nothing to compare with: what the path holds now (no directory:
        // nothing, and the persist makes it).
        Status s = SnapshotPath(*roots, path, &result->second);
        if (s.ok() || s.code() == Status::Code::kNotFound)
          result->first = {Verdict::kElsewhere, "the copy says nothing of what storage held"};
        else if (s.code() == Status::Code::kPermissionDenied || s.code() == Status::Code::kFailedPrecondition)
          result->first = {Verdict::kChanged, s.message()};
        else
          result->first = {Verdict::kUnavailable, s.ToString()};
      }))
    return {Verdict::kUnavailable, "storage did not answer in time"};
  *here = result->second;
  return result->first;
}

Status Cache::RefuseStaleCopy(const FileKey& key, const FileInfo& copy, const std::string& why,
                              const std::string& what) {
  ++counts_.stale_drops;
  // Known here from now on as what storage holds, so loads read storage and
  // ask the ring no more.
  FileInfo& f = files_[key];
  if (f.path.empty()) {
    f = copy;
    f.records.clear();
    f.disk = DiskIdentity();
    f.backup_holder.clear();
  }
  if (f.state != FileState::kDiscarded) f.state = FileState::kEvicted;
  f.buffer_id = 0;
  f.reason = "the ring's copy " + what + ": " + why;
  Note(f, false);
  TCE_LOG(kWarning, "ring") << "not restoring job=" << copy.job << " path=" << copy.path << " from "
                            << copy.backup_holder << ": " << why << "; storage serves it";
  return Status::FailedPrecondition("the ring's copy of " + copy.path + " " + what + " (" + why +
                                    "): storage serves it");
}

void Cache::StopWaits() {
  restores_->StopWaits();
  publication_->Stop();
}

std::vector<FileInfo> Cache::NotInMemory(const std::string& job) {
  MutexLock lock(&mu_);
  std::vector<FileInfo> out;
  for (const auto& [key, f] : files_)
    if (key.first == job && f.buffer_id == 0 && f.state != FileState::kEvicted &&
        f.state != FileState::kDiscarded)
      out.push_back(f);
  return out;
}

size_t Cache::InMemoryCount(const std::string& job) {
  MutexLock lock(&mu_);
  size_t n = 0;
  for (const auto& [key, f] : files_)
    n += key.first == job && f.buffer_id != 0 && f.state != FileState::kPending;
  return n;
}

Status Cache::StartPeerRead(const std::string& job, const std::string& path, FileInfo* out, int* fd) {
  MutexLock lock(&mu_);
  auto it = files_.find({job, path});
  if (it == files_.end() || it->second.buffer_id == 0 || it->second.state == FileState::kPending ||
      it->second.state == FileState::kEvicted || it->second.state == FileState::kDiscarded)
    return Status::NotFound(path + " is not in this server's memory");
  Buf& buf = buffers_[it->second.buffer_id];
  Status s = buf.mem->NewFd(/*writable=*/false, fd);
  if (!s.ok()) return s;
  ++buf.pins;  // not reused until EndPeerRead
  *out = it->second;
  return Status::OK();
}

void Cache::EndPeerRead(uint64_t buffer_id) {
  MutexLock lock(&mu_);
  auto b = buffers_.find(buffer_id);
  if (b == buffers_.end()) return;
  --b->second.pins;
  MaybeFree(b->second);
}

class Cache::RecoverySide : public RecoveryHost {
 public:
  explicit RecoverySide(Cache* cache) : c_(cache) {}
  Status Reserve(uint64_t size, std::unique_ptr<Buffer>* out) override { return c_->ReserveRecovery(size, out); }
  void Unreserve(std::unique_ptr<Buffer> mem) override { c_->AbandonRecovery(std::move(mem)); }
  StorageCheck CheckStorage(const FileInfo& f, DiskIdentity* here) override { return c_->CheckRecovered(f, here); }
  Status Adopt(FileInfo f, std::unique_ptr<Buffer> mem, const StorageCheck& storage,
               const DiskIdentity& here) override {
    return c_->AdoptRecovered(std::move(f), std::move(mem), storage, here);
  }
  size_t AdoptTags(const std::string& job, std::vector<TagInfo> tags) override {
    return c_->AdoptTags(job, std::move(tags));
  }
  std::vector<size_t> NotHeld(const TagInfo& tag) override { return c_->TagFilesNotHeld(tag); }
  bool ProbePath(const std::string& path, Status* status, DiskIdentity* now) override {
    return c_->ProbePath(path, status, now);
  }
  std::vector<FileInfo> NotInMemory(const std::string& job) override { return c_->NotInMemory(job); }
  size_t InMemoryCount(const std::string& job) override { return c_->InMemoryCount(job); }
  Status PinForPeer(const std::string& job, const std::string& path, FileInfo* out, int* fd) override {
    return c_->StartPeerRead(job, path, out, fd);
  }
  void Unpin(uint64_t buffer_id) override { c_->EndPeerRead(buffer_id); }

 private:
  Cache* const c_;
};

std::unique_ptr<RecoveryHost> Cache::MakeRecoverySide() { return std::make_unique<RecoverySide>(this); }

}  // namespace tce
