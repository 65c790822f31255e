// Replicas: published versions across nodes (cache/replicas.h).
#include "cache/replicas.h"

#include <algorithm>
#include <map>
#include <utility>

#include "common/validate.h"

namespace tce {

Replicas::Replicas(TagRegistry* tags, ReplicaHost* host) : tags_(tags), host_(host) {}

void Replicas::VersionDigests(TagInfo* tag, std::vector<DigestPin>* pins) {
  pins->clear();
  TagInfo recorded;
  if (!tags_->Find(tag->job, tag->tag, &recorded) || recorded.version != tag->version) return;
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
    // Only the node that published it digests a file: its own, never a
    // replica (whose digest is its source's).
    FileInfo f;
    int fd = -1;
    if (host_->PinVersionFile(recorded, *r, /*own_only=*/true, &f, &fd).ok())
      pins->push_back(DigestPin{i, f.buffer_id, fd});
  }
}

void Replicas::RecordDigests(const TagInfo& tag) {
  std::map<std::string, uint32_t> crc32;
  for (const TagFile& f : tag.files)
    if (f.has_crc32) crc32[f.path] = f.crc32;
  tags_->SetDigests(tag.job, tag.tag, tag.version, crc32);
}

Status Replicas::ReserveReplica(const std::string& job, uint64_t size, std::unique_ptr<Buffer>* out) {
  return host_->LendBuffer(job, size, out);
}

Status Replicas::AdoptFollowed(TagInfo tag) {
  // A source's word: its names and its tag's shape are checked as a
  // client's are, before anything is recorded.
  Status s = ValidateName("job", tag.job, /*allow_empty=*/false, /*allow_slash=*/true);
  if (s.ok()) {
    const std::string why = TagRegistry::Check(&tag);
    if (!why.empty()) s = Status::InvalidArgument("the source's version: " + why);
  }
  if (s.ok() && tag.version == 0) s = Status::InvalidArgument("the source's tag " + tag.tag + " has no version");
  if (!s.ok()) return s;
  return host_->RecordFollowed(std::move(tag));
}

Status Replicas::AdoptReplica(FileInfo f, uint64_t tag_version, std::unique_ptr<Buffer> mem) {
  return host_->InstallReplica(std::move(f), tag_version, std::move(mem));
}

Status Replicas::StartVersionRead(const std::string& job, const std::string& path, const std::string& tag,
                                  FileInfo* out, int* fd) {
  TagInfo t;
  if (!tags_->Find(job, tag, &t)) return Status::NotFound("no tag " + tag + " of job '" + job + "' here");
  auto tf = std::find_if(t.files.begin(), t.files.end(), [&](const TagFile& x) { return x.path == path; });
  if (tf == t.files.end()) return Status::NotFound(path + " of " + tag + " is not in this server's memory");
  return host_->PinVersionFile(t, *tf, /*own_only=*/false, out, fd);
}

void Replicas::NoteVersionRangeServed() { ranges_served_.fetch_add(1, std::memory_order_relaxed); }

bool Replicas::VersionTag(const std::string& job, const std::string& tag, TagInfo* out) {
  return tags_->Find(job, tag, out);
}

bool Replicas::HoldsInMemory(const std::string& job, const std::string& path, const std::string& tag) {
  return host_->HoldsVersionFile(job, path, tag);
}

void Replicas::AbandonRecovery(std::unique_ptr<Buffer> mem) { host_->ReturnBuffer(std::move(mem)); }

}  // namespace tce
