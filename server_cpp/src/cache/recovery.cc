#include "cache/recovery.h"

#include <string>
#include <utility>

#include "common/validate.h"

namespace tce {

Recovery::Recovery(const StorageRoots* storage, RecoveryHost* host) : storage_(storage), host_(host) {}

Status Recovery::ReserveRecovery(uint64_t size, std::unique_ptr<Buffer>* out) {
  Status s = host_->Reserve(size, out);
  if (!s.ok()) return s;
  MutexLock lock(&mu_);
  reserved_[(*out)->id()] = (*out)->capacity();
  return s;
}

void Recovery::Settle(const Buffer& mem) {
  MutexLock lock(&mu_);
  reserved_.erase(mem.id());
}

void Recovery::AbandonRecovery(std::unique_ptr<Buffer> mem) {
  if (!mem) return;
  Settle(*mem);
  host_->Unreserve(std::move(mem));
}

Status Recovery::AdoptRecovered(FileInfo f, std::unique_ptr<Buffer> mem) {
  Settle(*mem);
  // A peer's copy is checked like a save (its names) and against what this
  // server knows (its metadata, the ring's owner; the host's step): a peer
  // never names a path, an owner or a size of its own choosing.
  Status s = ValidateName("job", f.job, /*allow_empty=*/false, /*allow_slash=*/true);
  if (s.ok()) s = ValidateName("tag", f.tag, /*allow_empty=*/true, /*allow_slash=*/false);
  if (s.ok()) s = ValidatePath(f.path);
  if (s.ok()) s = storage_->CheckUnder(f.path);
  if (!s.ok()) {
    host_->Unreserve(std::move(mem));
    return Status::PermissionDenied("the ring's copy of " + f.path + " is refused: " + s.message());
  }
  // And against storage (before the host's step: filesystem calls): a copy
  // is never written over a file that changed since it was made, nor brings
  // back one that was deleted.
  DiskIdentity here;
  const StorageCheck storage = host_->CheckStorage(f, &here);
  s = host_->Adopt(std::move(f), std::move(mem), storage, here);
  MutexLock lock(&mu_);
  if (s.ok()) ++recovered_;
  if (s.code() == Status::Code::kDataLoss) ++mismatches_;  // not the file metadata knows
  return s;
}

size_t Recovery::AdoptTags(const std::string& job, std::vector<TagInfo> tags) {
  return host_->AdoptTags(job, std::move(tags));
}

Status Recovery::CheckRecoveredTag(const TagInfo& tag, const std::set<std::string>& listed) {
  for (size_t i : host_->NotHeld(tag)) {  // not in memory at the tag's size
    const TagFile& f = tag.files[i];
    const std::string names = "tag " + tag.tag + " names " + f.path + " (" + std::to_string(f.size) + " bytes), ";
    if (listed.count(f.path))
      return Status::FailedPrecondition(names + "which the ring listed as this node's but did not give back");
    if (!storage_->has_dirs() || storage_->ObjectRootOf(f.path, nullptr)) continue;  // memory only, or an object (not checked here)
    Status probed;
    DiskIdentity now;
    if (!host_->ProbePath(f.path, &probed, &now)) continue;  // storage cannot say
    if (probed.code() == Status::Code::kPermissionDenied)  // outside the roots, or a symlink on the way
      return Status::FailedPrecondition(names + "which is not a file under a storage root: " + probed.message());
    if (probed.ok() && now.exists && now.size != f.size)
      return Status::FailedPrecondition(names + "but storage holds " + std::to_string(now.size) + " bytes there");
  }
  return Status::OK();
}

std::vector<FileInfo> Recovery::NotInMemory(const std::string& job) { return host_->NotInMemory(job); }

size_t Recovery::InMemoryCount(const std::string& job) { return host_->InMemoryCount(job); }

Status Recovery::StartPeerRead(const std::string& job, const std::string& path, FileInfo* out, int* fd) {
  return host_->PinForPeer(job, path, out, fd);
}

void Recovery::EndPeerRead(uint64_t buffer_id) { host_->Unpin(buffer_id); }

RecoveryFigures Recovery::Figures() const {
  MutexLock lock(&mu_);
  RecoveryFigures f;
  f.recovered_files = recovered_;
  f.mismatches = mismatches_;
  f.reserved_buffers = reserved_.size();
  for (const auto& [id, capacity] : reserved_) f.reserved_bytes += capacity;
  return f;
}

}  // namespace tce
