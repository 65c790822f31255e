// Cache: files under object storage roots (storage/object_store.h). Their
// coherence compares an object's identity (ETag and size) where a file's is
// its inode; and a tag's completeness marker is written only after the
// tag's other files are durable. (A load that misses reads the object into
// the cache through StorageAccess.)
#include "cache/cache.h"
#include "common/logging.h"

namespace tce {

Status Cache::ProbeObject(const ObjectRoot& root, const std::string& key, ObjectId* out) {
  auto result = std::make_shared<std::pair<Status, ObjectId>>();
  std::shared_ptr<ObjectStore> store = root.store;
  if (!prober_->Run([=] { result->first = store->Stat(key, &result->second); }))
    return Status::Unavailable("object storage did not answer within " + std::to_string(check_timeout_.count()) +
                               " ms");
  *out = result->second;
  return result->first;
}

Status Cache::SessionRequester(const std::string& session, Requester* out) {
  MutexLock lock(&mu_);
  Status s = sessions_.Check(session);
  if (!s.ok()) return s;
  const uid_t uid = sessions_.Find(session)->uid;
  *out = {uid, owners_.IsAdmin(uid)};
  return s;
}

Requester Cache::RequesterOf(uid_t uid) {
  MutexLock lock(&mu_);
  return {uid, owners_.IsAdmin(uid)};
}

Requester Cache::JobRequester(const std::string& job) {
  MutexLock lock(&mu_);
  uid_t uid = 0;
  if (!owners_.Owner(job, &uid)) return Requester();
  return {uid, owners_.IsAdmin(uid)};
}

Status Cache::SnapshotObject(const ObjectRoot& root, const std::string& key, const std::string& path,
                             const Requester& who, DiskIdentity* out) {
  const uint64_t seq = ++disk_seq_;
  ObjectId now;
  Status s = ProbeObject(root, key, &now);
  if (!s.ok()) {
    NoteStorageFallback(path, s.ToString() + "; the save goes on unchecked");
    return Status::OK();
  }
  s = MayUse(who, now, root.store->Url(key), "replace");  // another uid's object: refused, as its file would be
  if (!s.ok()) return s;
  *out = IdentityOf(now);
  out->seq = seq;
  return Status::OK();
}

StorageCheck Cache::CheckObject(const ObjectRoot& root, const std::string& key, const DiskIdentity& expected) {
  ObjectId now;
  Status s = ProbeObject(root, key, &now);
  if (!s.ok()) return {Verdict::kUnavailable, s.ToString()};
  return CompareObject(root.store->Url(key), expected, now);
}

void Cache::ForgetTag(const std::string& job, const std::string& tag) {
  MutexLock lock(&mu_);
  DropTag(job, tag, "deleted from storage");
}

bool Cache::MarkerMustWait(const FileKey& key, const FileInfo& f) const {
  if (f.tag.empty() || !IsTagMarker(f.path) || !storage_->ObjectRootOf(f.path, nullptr)) return false;
  return LocalTagFilesPending(key, f) || PeersMustConfirm(key, f, nullptr);
}

bool Cache::LocalTagFilesPending(const FileKey& key, const FileInfo& f) const {
  for (const auto& [k, other] : files_) {
    if (k.first != key.first || other.tag != f.tag || k.second == key.second || other.buffer_id == 0) continue;
    if (other.state == FileState::kCached || other.state == FileState::kBackedUp ||
        other.state == FileState::kFailed || other.state == FileState::kPending)
      return true;
  }
  return false;
}

bool Cache::PeersMustConfirm(const FileKey& key, const FileInfo& f, std::vector<std::string>* remote) const {
  const Ring* ring = rings_.Find(key.first);
  if (!ring || ring->Peers().empty()) return false;  // one node: its own files are the tag's
  auto confirmed = peers_durable_.find(key);
  if (confirmed != peers_durable_.end() && confirmed->second == f.version) return false;
  TagInfo tag;
  if (!tags_.Find(key.first, f.tag, &tag)) return true;  // until its record comes (CommitTag)
  bool any = false;
  for (const TagFile& tf : tag.files) {
    if (tf.path == key.second || files_.count({key.first, tf.path})) continue;
    any = true;  // another node's
    if (remote) remote->push_back(tf.path);
  }
  return any;
}

std::vector<RingStore::HeldMarker> Cache::MarkersAwaitingPeers() {
  MutexLock lock(&mu_);
  std::vector<HeldMarker> out;
  for (const FileKey& key : waiting_markers_) {
    auto f = files_.find(key);
    if (f == files_.end() || LocalTagFilesPending(key, f->second)) continue;
    HeldMarker m;
    m.key = key;
    m.version = f->second.version;
    if (PeersMustConfirm(key, f->second, &m.remote) && !m.remote.empty()) out.push_back(std::move(m));
  }
  if (!out.empty()) ++counts_.marker_rounds;
  return out;
}

void Cache::PeersDurable(const FileKey& marker, uint64_t version) {
  MutexLock lock(&mu_);
  peers_durable_[marker] = version;
  TCE_LOG(kInfo, "cache") << "every node holds the other files of the tag of job=" << marker.first
                          << " path=" << marker.second << " durable: the marker goes to storage";
  ReleaseMarkers(marker.first);
}

std::vector<std::string> Cache::DurableOf(const std::string& job, const std::vector<std::string>& paths) {
  MutexLock lock(&mu_);
  std::vector<std::string> out;
  for (const std::string& path : paths) {
    auto f = files_.find({job, path});
    if (f != files_.end() && (f->second.state == FileState::kPersisted || f->second.state == FileState::kEvicted))
      out.push_back(path);
  }
  return out;
}

void Cache::ReleaseMarkers(const std::string& job) {
  for (auto it = waiting_markers_.begin(); it != waiting_markers_.end();) {
    auto f = files_.find(*it);
    if (it->first != job) {
      ++it;
    } else if (f == files_.end() || !MarkerMustWait(*it, f->second)) {
      if (f != files_.end()) QueuePersist(*it);
      it = waiting_markers_.erase(it);
    } else {
      ++it;
    }
  }
}

}  // namespace tce
