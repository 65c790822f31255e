#include "ring/backup_store.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <tuple>

#include "common/logging.h"
#include "persist/crc.h"

namespace tce {

Status MappedBuffer::Create(uint64_t id, uint64_t capacity, std::unique_ptr<MappedBuffer>* out) {
  std::unique_ptr<Buffer> b;
  Status s = Buffer::Create(id, capacity, &b);
  if (!s.ok()) return s;
  void* map = mmap(nullptr, capacity, PROT_READ | PROT_WRITE, MAP_SHARED, b->fd(), 0);
  if (map == MAP_FAILED) return Status::FromErrno(errno, "mmap backup buffer");
  // Read-touch a byte per page: maps the (fallocated) pages once, so no
  // receive into this buffer ever faults.
  volatile unsigned char sink = 0;
  const long page = sysconf(_SC_PAGESIZE);
  for (uint64_t off = 0; off < capacity; off += static_cast<uint64_t>(page))
    sink = sink + static_cast<unsigned char*>(map)[off];
  out->reset(new MappedBuffer(std::move(b), static_cast<unsigned char*>(map)));
  return Status::OK();
}

MappedBuffer::~MappedBuffer() { munmap(data_, buffer_->capacity()); }

Status BackupStore::Reserve(const std::string& job, const std::string& path, uint64_t size,
                            std::unique_ptr<MappedBuffer>* out) {
  const uint64_t capacity = Buffer::CapacityFor(size);
  uint64_t id = 0;
  std::vector<std::unique_ptr<MappedBuffer>> destroy;  // freed outside the lock
  {
    MutexLock l(&mu_);
    // 1. A free buffer that fits (the smallest).
    size_t best = free_.size();
    for (size_t i = 0; i < free_.size(); ++i)
      if (Buffer::Fits(free_[i]->capacity(), size) &&
          (best == free_.size() || free_[i]->capacity() < free_[best]->capacity()))
        best = i;
    if (best < free_.size()) {
      *out = std::move(free_[best]);
      free_.erase(free_.begin() + static_cast<long>(best));
      ++reused_;
      return Status::OK();
    }
    // 2. A new one, after destroying free ones if the share needs the room.
    // The copy it replaces counts as free: it goes once the new one is in.
    auto old = held_.find({job, path});
    const uint64_t replaced = old == held_.end() ? 0 : old->second.buffer->capacity();
    while (used_ - replaced + capacity > budget_ && !free_.empty()) {
      used_ -= free_.back()->capacity();
      destroy.push_back(std::move(free_.back()));
      free_.pop_back();
    }
    if (used_ - replaced + capacity > budget_)
      return Status::ResourceExhausted("backup share full: need " + std::to_string(capacity) +
                                       " bytes, " + std::to_string(budget_ - used_) + " of " +
                                       std::to_string(budget_) + " free");
    used_ += capacity;
    id = next_id_++;
  }
  destroy.clear();
  Status s = MappedBuffer::Create(id, capacity, out);  // slow (zero-fills): outside the lock
  if (!s.ok()) {
    MutexLock l(&mu_);
    used_ -= capacity;
  }
  return s;
}

void BackupStore::Abandon(std::unique_ptr<MappedBuffer> buffer) {
  if (!buffer) return;
  MutexLock l(&mu_);
  free_.push_back(std::move(buffer));
}

void BackupStore::Commit(HeldBackup held) {
  MutexLock l(&mu_);
  auto key = std::make_pair(held.file.job, held.file.path);
  auto old = held_.find(key);
  if (old != held_.end()) {
    free_.push_back(std::move(old->second.buffer));  // recycled by the next copy
    held_.erase(old);
  }
  TCE_LOG(kInfo, "ring") << "holding backup job=" << held.file.job << " path=" << held.file.path
                         << " size=" << held.file.size << " from " << held.owner
                         << (held.file.disk.written ? ", on " + held.owner + "'s storage" : "");
  held_.emplace(key, std::move(held));
}

bool BackupStore::NotePersisted(const std::string& job, const std::string& path, uint64_t version,
                                const std::string& from, const DiskIdentity& disk) {
  MutexLock l(&mu_);
  auto it = held_.find({job, path});
  if (it == held_.end() || it->second.file.version != version || it->second.owner != from) return false;
  it->second.file.disk = disk;
  TCE_LOG(kInfo, "ring") << "backup job=" << job << " path=" << path << " is on " << from << "'s storage";
  return true;
}

bool BackupStore::Drop(const std::string& job, const std::string& path, uint64_t version,
                       const std::string& from) {
  MutexLock l(&mu_);
  auto it = held_.find({job, path});
  if (it == held_.end() || (version != 0 && it->second.file.version != version) ||
      (!from.empty() && it->second.owner != from))
    return false;
  free_.push_back(std::move(it->second.buffer));
  held_.erase(it);
  TCE_LOG(kInfo, "ring") << "dropped backup job=" << job << " path=" << path;
  return true;
}

std::vector<HeldBackup> BackupStore::List(const std::string& job, int32_t owner_node) {
  MutexLock l(&mu_);
  std::vector<HeldBackup> out;
  for (const auto& [key, h] : held_) {
    if (key.first != job || h.owner_node != owner_node) continue;
    HeldBackup copy;
    copy.file = h.file;
    copy.check_ranges = h.check_ranges;
    copy.owner = h.owner;
    copy.owner_node = h.owner_node;
    copy.job_uid = h.job_uid;
    out.push_back(std::move(copy));
  }
  return out;
}

Status BackupStore::Open(const std::string& job, const std::string& path, HeldBackup* info, int* fd) {
  MutexLock l(&mu_);
  auto it = held_.find({job, path});
  if (it == held_.end()) return Status::NotFound("no copy of " + path + " is held for job " + job);
  info->file = it->second.file;
  info->check_ranges = it->second.check_ranges;
  info->owner = it->second.owner;
  info->owner_node = it->second.owner_node;
  info->job_uid = it->second.job_uid;
  return it->second.buffer->buffer().NewFd(/*writable=*/false, fd);
}

Status BackupStore::OpenForRing(const std::string& job, const std::string& path,
                                const std::vector<std::string>& ring, HeldBackup* info, int* fd) {
  Status s = Open(job, path, info, fd);
  if (!s.ok()) return Status::NotFound(s.message());
  if (std::find(ring.begin(), ring.end(), info->owner) != ring.end()) return s;
  ::close(*fd);
  *fd = -1;
  return Status::PermissionDenied("the copy of " + path + " held here was sent by " + info->owner +
                                  ", not a member of job " + job + "'s ring");
}

void BackupStore::CountCorrupt() {
  MutexLock l(&mu_);
  ++corrupt_;
}

BackupStoreStats BackupStore::Stats() {
  MutexLock l(&mu_);
  BackupStoreStats s;
  s.budget = budget_;
  s.used = used_;
  s.files = held_.size();
  for (const auto& [key, h] : held_) s.bytes += h.file.size;
  s.rejected_corrupt = corrupt_;
  s.reused = reused_;
  for (const auto& [key, tags] : tags_) s.tags += tags.size();
  return s;
}

size_t BackupStore::TagBytes(const TagInfo& tag) {
  size_t n = 64 + tag.job.size() + tag.tag.size();
  for (const TagFile& f : tag.files) n += 32 + f.path.size();
  return n;
}

Status BackupStore::HoldTag(HeldTag held) {
  const size_t bytes = TagBytes(held.tag);
  if (bytes > kMaxTagBytesPerOwner)
    return Status::ResourceExhausted("tag " + held.tag.tag + " is " + std::to_string(bytes) +
                                     " bytes, more than a server holds of one peer's tags");
  MutexLock l(&mu_);
  const std::pair<std::string, int32_t> key{held.tag.job, held.owner_node};
  auto& tags = tags_[key];
  auto it = tags.find(held.tag.tag);
  if (it != tags.end() && it->second.tag.complete_unix_ns > held.tag.complete_unix_ns)
    return Status::OK();  // a late resend of an older record
  const size_t replaced = it == tags.end() ? 0 : TagBytes(it->second.tag);
  if (tag_bytes_ - replaced + bytes > kMaxTagBytes) {
    if (tags.empty()) tags_.erase(key);
    return Status::ResourceExhausted("the tags held here take " + std::to_string(tag_bytes_) +
                                     " bytes, the most a server holds for its peers");
  }
  tag_bytes_ = tag_bytes_ - replaced + bytes;
  size_t owner_bytes = 0;
  for (const auto& [name, t] : tags) owner_bytes += TagBytes(t.tag);
  owner_bytes = owner_bytes - replaced + bytes;
  const std::string name = held.tag.tag;
  tags[name] = std::move(held);
  while (owner_bytes > kMaxTagBytesPerOwner) {  // the oldest go
    auto oldest = tags.begin();
    for (auto t = tags.begin(); t != tags.end(); ++t)
      if (t->second.tag.complete_unix_ns < oldest->second.tag.complete_unix_ns) oldest = t;
    const size_t gone = TagBytes(oldest->second.tag);
    owner_bytes -= gone;
    tag_bytes_ -= gone;
    tags.erase(oldest);
  }
  return Status::OK();
}

std::vector<HeldTag> BackupStore::Tags(const std::string& job, int32_t owner_node) {
  std::vector<HeldTag> out;
  {
    MutexLock l(&mu_);
    auto it = tags_.find({job, owner_node});
    if (it == tags_.end()) return out;
    for (const auto& [name, t] : it->second) out.push_back(t);
  }
  std::sort(out.begin(), out.end(), [](const HeldTag& a, const HeldTag& b) {
    return std::tie(a.tag.complete_unix_ns, a.tag.tag) < std::tie(b.tag.complete_unix_ns, b.tag.tag);
  });
  return out;
}

Status CompareCrcs(const std::vector<Record>& records, const std::vector<uint32_t>& computed) {
  for (size_t i = 0; i < records.size(); ++i)
    if (computed[i] != records[i].crc32)
      return Status::Internal("checksum mismatch in record " + records[i].name + ": expected " +
                              std::to_string(records[i].crc32) + ", got " + std::to_string(computed[i]));
  return Status::OK();
}

Status CheckRecordBounds(uint64_t size, const std::vector<Record>& records) {
  for (const Record& r : records)
    if (r.data_offset > size || r.size > size - r.data_offset)
      return Status::InvalidArgument("record " + r.name + " ends past the file");
  return Status::OK();
}

Status VerifyRecords(const unsigned char* data, uint64_t size, const std::vector<Record>& records) {
  if (Status s = CheckRecordBounds(size, records); !s.ok()) return s;
  RecordCrcs crcs(records);
  crcs.Feed(0, data, static_cast<size_t>(size));
  return CompareCrcs(records, crcs.crcs());
}

}  // namespace tce
