// Cache: its side of published versions across nodes (cache/replicas.h).
// Replicas checks what a source says and answers from the TagRegistry;
// here are the buffers lent for replicas, the replicas themselves beside
// the node's own files, and the pins on a version's files (ReplicaSide,
// each call under the Cache's lock).
#include <algorithm>

#include "cache/cache.h"
#include "common/logging.h"

namespace tce {

const FileInfo* Cache::VersionFile(const std::string& job, const std::string& path,
                                   const std::string& tag) const {
  auto own = files_.find({job, path});
  if (own != files_.end()) return &own->second;
  auto replica = replica_files_.find({job, path});
  if (replica == replica_files_.end()) return nullptr;
  auto snapshot = published_.find({job, tag});
  if (snapshot == published_.end()) return nullptr;
  auto at = snapshot->second.find(path);
  return at != snapshot->second.end() && at->second == replica->second.version ? &replica->second : nullptr;
}

class Cache::ReplicaSide : public ReplicaHost {
 public:
  explicit ReplicaSide(Cache* cache) : c_(cache) {}

  Status LendBuffer(const std::string& job, uint64_t size, std::unique_ptr<Buffer>* out) override {
    {
      MutexLock lock(&c_->mu_);
      uid_t owner = 0;
      if (c_->owners_.Owner(job, &owner)) {
        for (auto& [id, b] : c_->buffers_) {
          if (b.state != BufState::kFree || b.leases || b.pins || !b.mappers.empty() || !b.mem || b.no_reuse ||
              b.uid != owner || !Buffer::Fits(b.capacity, size))
            continue;
          // Lent out: its bytes count as reserved until it is adopted again.
          *out = std::move(b.mem);
          c_->used_ -= b.capacity;
          c_->reserved_ += b.capacity;
          c_->lent_readers_[id] = std::move(b.readers);
          ++c_->counts_.buffers_reused;
          c_->buffers_.erase(id);
          return Status::OK();
        }
      }
    }
    return c_->ReserveRecovery(size, out);
  }

  void ReturnBuffer(std::unique_ptr<Buffer> mem) override { c_->AbandonRecovery(std::move(mem)); }

  Status RecordFollowed(TagInfo tag) override {
    MutexLock lock(&c_->mu_);
    uid_t owner = 0;
    if (!c_->owners_.Owner(tag.job, &owner))
      return Status::FailedPrecondition("job '" + tag.job + "' is not followed here");
    TagInfo known;
    if (c_->tags_.FindVersion(tag.job, tag.version, &known) && known.tag == tag.tag && known.epoch == tag.epoch)
      return Status::OK();
    const std::string job = tag.job, name = tag.tag;
    const uint64_t version = tag.version;
    const uint64_t before = c_->JobTagBytes(job);  // a new epoch may replace every tag of the job
    bool kept = false;
    const std::string why = c_->tags_.Follow(std::move(tag), &kept);
    if (!why.empty()) return Status::DataLoss("the source's version of job '" + job + "': " + why);
    if (!kept) return Status::OK();  // a newer record of that tag is here
    c_->quota_.Credit(c_->TagOwner(job), before);
    c_->quota_.Force(c_->TagOwner(job), c_->JobTagBytes(job));
    c_->TrimTags(job);
    TagInfo recorded;
    if (c_->tags_.Find(job, name, &recorded) && recorded.version != version)
      TCE_LOG(kWarning, "weights") << "followed job=" << job << " tag=" << name << ": version " << version
                                   << " is numbered " << recorded.version << " here";
    c_->published_.erase({job, name});  // its files here are the replicas brought for it
    TCE_LOG(kInfo, "weights") << "followed job=" << job << " tag=" << name << " version=" << recorded.version;
    ++c_->counts_.versions_published;
    c_->publication_->Changed();
    return Status::OK();
  }

  Status InstallReplica(FileInfo f, uint64_t tag_version, std::unique_ptr<Buffer> mem) override {
    MutexLock lock(&c_->mu_);
    c_->reserved_ -= mem->capacity();
    std::set<std::string> readers;  // of a reused buffer
    bool reused = false;
    if (auto lent = c_->lent_readers_.find(mem->id()); lent != c_->lent_readers_.end()) {
      readers = std::move(lent->second);
      c_->lent_readers_.erase(lent);
      reused = true;
    }
    // A refusal below drops `mem` (its pages go): its readers are told.
    TagInfo tag;
    if (!c_->tags_.FindVersion(f.job, tag_version, &tag)) {
      c_->OweUnmaps(readers, mem->id());
      return Status::NotFound("version " + std::to_string(tag_version) + " of job '" + f.job + "' is gone here");
    }
    auto listed =
        std::find_if(tag.files.begin(), tag.files.end(), [&](const TagFile& t) { return t.path == f.path; });
    if (listed == tag.files.end() || listed->size != f.size) {
      c_->OweUnmaps(readers, mem->id());
      return Status::InvalidArgument(f.path + " (" + std::to_string(f.size) + " bytes) is not a file of version " +
                                     std::to_string(tag_version) + " of job '" + f.job + "'");
    }
    if (c_->files_.count({f.job, f.path})) {
      c_->OweUnmaps(readers, mem->id());
      return Status::FailedPrecondition(f.path + " is this node's own file of job '" + f.job + "'");
    }
    uid_t owner = 0;
    c_->owners_.Owner(f.job, &owner);
    Buf& buf = c_->Install(std::move(mem), /*created=*/!reused);
    const uint64_t id = buf.id;
    buf.state = BufState::kCached;
    buf.uid = owner;
    buf.readers = std::move(readers);
    auto old = c_->replica_files_.find({f.job, f.path});
    if (old != c_->replica_files_.end()) c_->ReleaseBuffer(old->second.buffer_id);
    f.buffer_id = id;
    f.capacity = buf.capacity;
    f.state = FileState::kCached;
    f.tag = tag.tag;
    f.rank = listed->rank;
    f.owner_uid = owner;
    f.version = c_->next_allocation_id_++;
    f.committed_unix_ns = c_->clock_->UnixNowNs();
    c_->published_[{f.job, tag.tag}][f.path] = f.version;
    TCE_LOG(kInfo, "weights") << "replica job=" << f.job << " version=" << tag_version << " path=" << f.path
                              << " size=" << f.size << " buffer=" << id;
    c_->replica_files_[{f.job, f.path}] = std::move(f);
    return Status::OK();
  }

  Status PinVersionFile(const TagInfo& tag, const TagFile& tf, bool own_only, FileInfo* out, int* fd) override {
    MutexLock lock(&c_->mu_);
    const FileInfo* f = nullptr;
    if (own_only) {
      auto own = c_->files_.find({tag.job, tf.path});
      if (own != c_->files_.end()) f = &own->second;
    } else {
      f = c_->VersionFile(tag.job, tf.path, tag.tag);
    }
    if (!f || !c_->IsVersionsFile(tag, tf, *f) || f->buffer_id == 0 || f->state == FileState::kPending ||
        f->state == FileState::kEvicted || f->state == FileState::kDiscarded)
      return Status::NotFound(tf.path + " of " + tag.tag + " is not in this server's memory");
    Buf& buf = c_->buffers_[f->buffer_id];
    Status s = buf.mem->NewFd(/*writable=*/false, fd);
    if (!s.ok()) return s;
    ++buf.pins;  // not reused until EndPeerRead
    *out = *f;
    return Status::OK();
  }

  bool HoldsVersionFile(const std::string& job, const std::string& path, const std::string& tag) override {
    MutexLock lock(&c_->mu_);
    const FileInfo* f = c_->VersionFile(job, path, tag);
    return f && f->buffer_id != 0 && f->state != FileState::kEvicted && f->state != FileState::kDiscarded &&
           f->state != FileState::kPending;
  }

 private:
  Cache* const c_;
};

std::unique_ptr<ReplicaHost> Cache::MakeReplicaSide() { return std::make_unique<ReplicaSide>(this); }

}  // namespace tce
