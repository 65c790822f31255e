#include "cache/metadata_quota.h"

#include <algorithm>

#include "common/strings.h"

namespace tce {
namespace {

// A node of a std::map or std::set, with its key's std::string header.
constexpr uint64_t kNodeBytes = 96;

}  // namespace

uint64_t MetadataQuota::TagBytes(const TagInfo& tag) {
  // The record (in the registry) and the snapshot of its files' versions
  // (published_): each file's path twice.
  uint64_t bytes = 2 * kNodeBytes + 2 * (tag.job.size() + tag.tag.size()) + sizeof(TagInfo);
  for (const TagFile& f : tag.files) bytes += 2 * f.path.size() + sizeof(TagFile) + kNodeBytes;
  return bytes;
}

uint64_t MetadataQuota::JobBytes(const std::string& job) { return kNodeBytes + job.size(); }

void MetadataQuota::SetLimits(const MetadataLimits& limits) {
  limits_ = limits;
  const unsigned pct = std::min(100u, std::max(1u, limits.share_per_uid_percent));
  per_uid_ = limits.budget / 100 * pct + limits.budget % 100 * pct / 100;
}

bool MetadataQuota::Fits(uid_t uid, uint64_t bytes) const {
  return used_ + bytes <= limits_.budget && used_by(uid) + bytes <= per_uid_;
}

Status MetadataQuota::Charge(uid_t uid, uint64_t bytes, const std::string& what) {
  if (used_by(uid) + bytes > per_uid_)
    return Status::ResourceExhausted("uid " + std::to_string(uid) + " may not add " + what + ": its records take " +
                                     HumanBytes(used_by(uid)) + " of the server's memory, and " +
                                     HumanBytes(bytes) + " more would pass its share, " + HumanBytes(per_uid_) +
                                     " (metadata_share_per_uid of metadata_budget)");
  if (used_ + bytes > limits_.budget)
    return Status::ResourceExhausted("the server may not add " + what + ": its records take " + HumanBytes(used_) +
                                     ", and " + HumanBytes(bytes) + " more would pass metadata_budget, " +
                                     HumanBytes(limits_.budget));
  Force(uid, bytes);
  return Status::OK();
}

void MetadataQuota::Force(uid_t uid, uint64_t bytes) {
  if (bytes == 0) return;
  used_ += bytes;
  by_uid_[uid] += bytes;
}

void MetadataQuota::Credit(uid_t uid, uint64_t bytes) {
  auto it = by_uid_.find(uid);
  if (it == by_uid_.end()) return;
  bytes = std::min(bytes, it->second);
  it->second -= bytes;
  used_ -= std::min(bytes, used_);
  if (it->second == 0) by_uid_.erase(it);
}

uint64_t MetadataQuota::used_by(uid_t uid) const {
  auto it = by_uid_.find(uid);
  return it == by_uid_.end() ? 0 : it->second;
}

}  // namespace tce
