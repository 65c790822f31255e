// Cache: published versions across nodes (docs/weights.md). The side of a
// node whose versions others follow (a following node, checked against the
// nodes the job's owner granted), and the side of a node that follows them
// (its local followers, the versions it learns, the replicas of their files
// it is brought).
#include <algorithm>

#include "cache/cache.h"
#include "cache/weight_files.h"
#include "common/logging.h"
#include "common/validate.h"

namespace tce {

const FileInfo* Cache::VersionFile(const std::string& job, const std::string& path,
                                   const std::string& tag) const {
  auto own = files_.find({job, path});
  if (own != files_.end()) return &own->second;
  auto replica = replicas_.find({job, path});
  if (replica == replicas_.end()) return nullptr;
  auto snapshot = published_.find({job, tag});
  if (snapshot == published_.end()) return nullptr;
  auto at = snapshot->second.find(path);
  return at != snapshot->second.end() && at->second == replica->second.version ? &replica->second : nullptr;
}

void Cache::VersionDigests(TagInfo* tag, std::vector<DigestPin>* pins) {
  pins->clear();
  MutexLock lock(&mu_);
  TagInfo recorded;
  if (!tags_.Find(tag->job, tag->tag, &recorded) || recorded.version != tag->version) return;
  for (size_t i = 0; i < tag->files.size(); ++i) {
    TagFile& tf = tag->files[i];
    auto r = std::find_if(recorded.files.begin(), recorded.files.end(),
                          [&](const TagFile& x) { return x.path == tf.path; });
    if (r == recorded.files.end()) continue;
    if (r->has_crc32) {
      tf.crc32 = r->crc32;
      tf.has_crc32 = true;
      continue;
    }
    auto own = files_.find({tag->job, tf.path});  // never a replica's
    if (own == files_.end()) continue;
    const FileInfo& f = own->second;
    if (!IsVersionsFile(recorded, *r, f) || f.buffer_id == 0 || f.state == FileState::kPending ||
        f.state == FileState::kEvicted || f.state == FileState::kDiscarded)
      continue;
    Buf& buf = buffers_[f.buffer_id];
    int fd = -1;
    if (!buf.mem->NewFd(/*writable=*/false, &fd).ok()) continue;
    ++buf.pins;  // not reused until EndPeerRead
    pins->push_back(DigestPin{i, f.buffer_id, fd});
  }
}

void Cache::RecordDigests(const TagInfo& tag) {
  std::map<std::string, uint32_t> crc32;
  for (const TagFile& f : tag.files)
    if (f.has_crc32) crc32[f.path] = f.crc32;
  tags_.SetDigests(tag.job, tag.tag, tag.version, crc32);
}

Status Cache::AdoptFollowed(TagInfo tag) {
  Status s = ValidateName("job", tag.job, /*allow_empty=*/false, /*allow_slash=*/true);
  if (s.ok()) {
    const std::string why = TagRegistry::Check(&tag);
    if (!why.empty()) s = Status::InvalidArgument("the source's version: " + why);
  }
  if (s.ok() && tag.version == 0) s = Status::InvalidArgument("the source's tag " + tag.tag + " has no version");
  if (!s.ok()) return s;
  MutexLock lock(&mu_);
  uid_t owner = 0;
  if (!owners_.Owner(tag.job, &owner))
    return Status::FailedPrecondition("job '" + tag.job + "' is not followed here");
  TagInfo known;
  if (tags_.FindVersion(tag.job, tag.version, &known) && known.tag == tag.tag && known.epoch == tag.epoch)
    return Status::OK();
  const std::string job = tag.job, name = tag.tag;
  const uint64_t version = tag.version;
  const uint64_t before = JobTagBytes(job);  // a new epoch may replace every tag of the job
  bool kept = false;
  const std::string why = tags_.Follow(std::move(tag), &kept);
  if (!why.empty()) return Status::DataLoss("the source's version of job '" + job + "': " + why);
  if (!kept) return Status::OK();  // a newer record of that tag is here
  quota_.Credit(TagOwner(job), before);
  quota_.Force(TagOwner(job), JobTagBytes(job));
  TrimTags(job);
  TagInfo recorded;
  if (tags_.Find(job, name, &recorded) && recorded.version != version)
    TCE_LOG(kWarning, "weights") << "followed job=" << job << " tag=" << name << ": version " << version
                                 << " is numbered " << recorded.version << " here";
  published_.erase({job, name});  // its files here are the replicas brought for it
  TCE_LOG(kInfo, "weights") << "followed job=" << job << " tag=" << name << " version=" << recorded.version;
  ++counts_.versions_published;
  publication_->Changed();
  return Status::OK();
}

Status Cache::ReserveReplica(const std::string& job, uint64_t size, std::unique_ptr<Buffer>* out) {
  {
    MutexLock lock(&mu_);
    uid_t owner = 0;
    if (owners_.Owner(job, &owner)) {
      for (auto& [id, b] : buffers_) {
        if (b.state != BufState::kFree || b.leases || b.pins || !b.mappers.empty() || !b.mem || b.no_reuse ||
            b.uid != owner || !Buffer::Fits(b.capacity, size))
          continue;
        // Lent out: its bytes count as reserved until it is adopted again.
        *out = std::move(b.mem);
        used_ -= b.capacity;
        reserved_ += b.capacity;
        lent_readers_[id] = std::move(b.readers);
        ++counts_.buffers_reused;
        buffers_.erase(id);
        return Status::OK();
      }
    }
  }
  return ReserveRecovery(size, out);
}

Status Cache::AdoptReplica(FileInfo f, uint64_t tag_version, std::unique_ptr<Buffer> mem) {
  MutexLock lock(&mu_);
  reserved_ -= mem->capacity();
  std::set<std::string> readers;  // of a reused buffer
  bool reused = false;
  if (auto lent = lent_readers_.find(mem->id()); lent != lent_readers_.end()) {
    readers = std::move(lent->second);
    lent_readers_.erase(lent);
    reused = true;
  }
  // A refusal below drops `mem` (its pages go): its readers are told.
  TagInfo tag;
  if (!tags_.FindVersion(f.job, tag_version, &tag)) {
    OweUnmaps(readers, mem->id());
    return Status::NotFound("version " + std::to_string(tag_version) + " of job '" + f.job + "' is gone here");
  }
  auto listed = std::find_if(tag.files.begin(), tag.files.end(), [&](const TagFile& t) { return t.path == f.path; });
  if (listed == tag.files.end() || listed->size != f.size) {
    OweUnmaps(readers, mem->id());
    return Status::InvalidArgument(f.path + " (" + std::to_string(f.size) + " bytes) is not a file of version " +
                                   std::to_string(tag_version) + " of job '" + f.job + "'");
  }
  if (files_.count({f.job, f.path})) {
    OweUnmaps(readers, mem->id());
    return Status::FailedPrecondition(f.path + " is this node's own file of job '" + f.job + "'");
  }
  uid_t owner = 0;
  owners_.Owner(f.job, &owner);
  Buf& buf = Install(std::move(mem), /*created=*/!reused);
  const uint64_t id = buf.id;
  buf.state = BufState::kCached;
  buf.uid = owner;
  buf.readers = std::move(readers);
  auto old = replicas_.find({f.job, f.path});
  if (old != replicas_.end()) ReleaseBuffer(old->second.buffer_id);
  f.buffer_id = id;
  f.capacity = buf.capacity;
  f.state = FileState::kCached;
  f.tag = tag.tag;
  f.rank = listed->rank;
  f.owner_uid = owner;
  f.version = next_allocation_id_++;
  f.committed_unix_ns = clock_->UnixNowNs();
  published_[{f.job, tag.tag}][f.path] = f.version;
  TCE_LOG(kInfo, "weights") << "replica job=" << f.job << " version=" << tag_version << " path=" << f.path
                            << " size=" << f.size << " buffer=" << id;
  replicas_[{f.job, f.path}] = std::move(f);
  return Status::OK();
}

Status Cache::StartVersionRead(const std::string& job, const std::string& path, const std::string& tag,
                               FileInfo* out, int* fd) {
  MutexLock lock(&mu_);
  TagInfo t;
  if (!tags_.Find(job, tag, &t)) return Status::NotFound("no tag " + tag + " of job '" + job + "' here");
  auto tf = std::find_if(t.files.begin(), t.files.end(), [&](const TagFile& x) { return x.path == path; });
  const FileInfo* f = tf == t.files.end() ? nullptr : VersionFile(job, path, tag);
  if (!f || !IsVersionsFile(t, *tf, *f) || f->buffer_id == 0 || f->state == FileState::kPending ||
      f->state == FileState::kEvicted || f->state == FileState::kDiscarded)
    return Status::NotFound(path + " of " + tag + " is not in this server's memory");
  Buf& buf = buffers_[f->buffer_id];
  Status s = buf.mem->NewFd(/*writable=*/false, fd);
  if (!s.ok()) return s;
  ++buf.pins;  // not reused until EndPeerRead
  *out = *f;
  return Status::OK();
}

void Cache::NoteVersionRangeServed() {
  MutexLock lock(&mu_);
  ++counts_.version_ranges_served;
}

bool Cache::HoldsInMemory(const std::string& job, const std::string& path, const std::string& tag) {
  MutexLock lock(&mu_);
  const FileInfo* f = VersionFile(job, path, tag);
  return f && f->buffer_id != 0 && f->state != FileState::kEvicted && f->state != FileState::kDiscarded &&
         f->state != FileState::kPending;
}

}  // namespace tce
