#include "cache/tag_registry.h"

#include <sys/random.h>

#include <algorithm>
#include <set>
#include <tuple>

namespace tce {

namespace {

// A tag's digests are its publishing node's only (SetDigests).
void DropDigests(TagInfo* tag) {
  for (TagFile& f : tag->files) f.crc32 = 0, f.has_crc32 = false;
}

// A new epoch: 63 random bits, never 0 (it fits a signed 64-bit column).
uint64_t NewEpoch() {
  uint64_t e = 0;
  while (e == 0) {
    if (getrandom(&e, sizeof(e), 0) != static_cast<ssize_t>(sizeof(e))) e = 0;
    e &= ~(uint64_t{1} << 63);
  }
  return e;
}

}  // namespace

uint64_t TagRegistry::EpochOf(const std::string& job, uint64_t hint) {
  uint64_t& e = epochs_[job];
  if (e == 0) e = hint ? hint : NewEpoch();
  return e;
}

void TagRegistry::SetDigests(const std::string& job, const std::string& tag, uint64_t version,
                             const std::map<std::string, uint32_t>& crc32) {
  MutexLock lock(&mu_);
  auto it = tags_.find({job, tag});
  if (it == tags_.end() || it->second.version != version) return;
  for (TagFile& f : it->second.files) {
    auto c = crc32.find(f.path);
    if (c == crc32.end()) continue;
    f.crc32 = c->second;
    f.has_crc32 = true;
  }
}

uint64_t TagRegistry::Epoch(const std::string& job) const {
  MutexLock lock(&mu_);
  auto it = epochs_.find(job);
  return it == epochs_.end() ? 0 : it->second;
}

std::string TagRegistry::Check(TagInfo* tag) {
  std::sort(tag->files.begin(), tag->files.end(), [](const TagFile& a, const TagFile& b) {
    return std::tie(a.rank, a.path) < std::tie(b.rank, b.path);
  });
  if (tag->job.empty()) return "a tag needs a job";
  if (tag->tag.empty()) return "a tag needs a name";
  if (tag->world_size < 1) return "world_size must be >= 1, got " + std::to_string(tag->world_size);
  if (tag->files.empty()) return "tag " + tag->tag + " lists no files";
  std::set<std::string> seen;
  for (const TagFile& f : tag->files) {
    if (f.path.empty() || f.path[0] != '/') return "tag file path must be absolute: '" + f.path + "'";
    if (f.rank < 0 || f.rank >= tag->world_size)
      return "rank " + std::to_string(f.rank) + " of " + f.path + " is outside world_size " +
             std::to_string(tag->world_size);
    if (!seen.insert(f.path).second) return "file listed twice in tag " + tag->tag + ": " + f.path;
  }
  return "";
}

uint64_t TagRegistry::NextVersion(const std::string& job) const {
  uint64_t top = 0;
  for (auto it = tags_.lower_bound({job, ""}); it != tags_.end() && it->first.first == job; ++it)
    top = std::max(top, it->second.version);
  return top + 1;
}

bool TagRegistry::VersionTaken(const std::string& job, const std::string& tag,
                               uint64_t version) const {
  for (auto it = tags_.lower_bound({job, ""}); it != tags_.end() && it->first.first == job; ++it)
    if (it->first.second != tag && it->second.version == version) return true;
  return false;
}

TagInfo TagRegistry::Complete(TagInfo tag, int64_t complete_unix_ns) {
  tag.complete_unix_ns = complete_unix_ns;
  DropDigests(&tag);
  MutexLock lock(&mu_);
  tag.version = NextVersion(tag.job);
  tag.epoch = EpochOf(tag.job);
  return tags_[{tag.job, tag.tag}] = std::move(tag);
}

bool TagRegistry::Remove(const std::string& job, const std::string& tag, TagInfo* out) {
  MutexLock lock(&mu_);
  auto it = tags_.find({job, tag});
  if (it == tags_.end()) return false;
  if (out) *out = std::move(it->second);
  tags_.erase(it);
  return true;
}

size_t TagRegistry::Count(const std::string& job) const {
  MutexLock lock(&mu_);
  size_t n = 0;
  for (auto it = tags_.lower_bound({job, ""}); it != tags_.end() && it->first.first == job; ++it) ++n;
  return n;
}

bool TagRegistry::Oldest(const std::string& job, const std::string& except, std::string* tag) const {
  MutexLock lock(&mu_);
  const TagInfo* oldest = nullptr;
  for (auto it = tags_.lower_bound({job, ""}); it != tags_.end() && it->first.first == job; ++it)
    if (it->first.second == except) continue;
    else if (!oldest || std::tie(it->second.complete_unix_ns, it->second.tag) <
                       std::tie(oldest->complete_unix_ns, oldest->tag))
      oldest = &it->second;
  if (oldest) *tag = oldest->tag;
  return oldest != nullptr;
}

bool TagRegistry::Adopt(TagInfo tag) {
  MutexLock lock(&mu_);
  tag.epoch = EpochOf(tag.job, tag.epoch);  // a tag pulled back keeps the numbering it had
  DropDigests(&tag);
  return AdoptLocked(std::move(tag));
}

bool TagRegistry::AdoptLocked(TagInfo tag) {
  auto it = tags_.find({tag.job, tag.tag});
  if (it != tags_.end() && it->second.complete_unix_ns >= tag.complete_unix_ns) return false;
  if (tag.version == 0 || VersionTaken(tag.job, tag.tag, tag.version)) tag.version = NextVersion(tag.job);
  tags_[{tag.job, tag.tag}] = std::move(tag);
  return true;
}

std::string TagRegistry::Follow(TagInfo tag, bool* kept) {
  *kept = false;
  if (tag.epoch == 0) return "version " + std::to_string(tag.version) + " has no epoch";
  MutexLock lock(&mu_);
  auto known = epochs_.find(tag.job);
  const bool same = known != epochs_.end() && known->second == tag.epoch;
  const uint64_t newest = NextVersion(tag.job) - 1;
  const uint64_t base = same ? newest : 0;
  if (tag.version > base + kMaxVersionJump)
    return "version " + std::to_string(tag.version) + " is more than " + std::to_string(kMaxVersionJump) +
           " above " + std::to_string(base) + ", the newest here of its numbering (epoch " +
           std::to_string(tag.epoch) + ")";
  if (!same) {  // the source's numbering started afresh (or this node never saw it)
    uint64_t& below = restarted_below_[tag.job];
    below = std::max(below, newest);
    for (auto it = tags_.lower_bound({tag.job, ""}); it != tags_.end() && it->first.first == tag.job;)
      it = tags_.erase(it);
    epochs_[tag.job] = tag.epoch;
  }
  *kept = AdoptLocked(std::move(tag));
  return "";
}

bool TagRegistry::Newest(const std::string& job, uint64_t after, TagInfo* out) const {
  MutexLock lock(&mu_);
  const TagInfo* best = nullptr;
  for (auto it = tags_.lower_bound({job, ""}); it != tags_.end() && it->first.first == job; ++it)
    if (!best || it->second.version > best->version) best = &it->second;
  if (!best) return false;
  auto below = restarted_below_.find(job);
  const bool earlier_epoch = below != restarted_below_.end() && after > best->version && after <= below->second;
  if (best->version <= after && !earlier_epoch) return false;
  *out = *best;
  return true;
}

bool TagRegistry::FindVersion(const std::string& job, uint64_t version, TagInfo* out) const {
  MutexLock lock(&mu_);
  for (auto it = tags_.lower_bound({job, ""}); it != tags_.end() && it->first.first == job; ++it) {
    if (it->second.version == version) {
      *out = it->second;
      return true;
    }
  }
  return false;
}

bool TagRegistry::Find(const std::string& job, const std::string& tag, TagInfo* out) const {
  MutexLock lock(&mu_);
  auto it = tags_.find({job, tag});
  if (it == tags_.end()) return false;
  *out = it->second;
  return true;
}

std::vector<TagInfo> TagRegistry::List(const std::string& job) const {
  std::vector<TagInfo> out;
  {
    MutexLock lock(&mu_);
    for (auto it = tags_.lower_bound({job, ""}); it != tags_.end() && it->first.first == job; ++it)
      out.push_back(it->second);
  }
  std::sort(out.begin(), out.end(), [](const TagInfo& a, const TagInfo& b) {
    return std::tie(a.complete_unix_ns, a.tag) < std::tie(b.complete_unix_ns, b.tag);
  });
  return out;
}

std::vector<TagInfo> TagRegistry::All() const {
  MutexLock lock(&mu_);
  std::vector<TagInfo> out;
  out.reserve(tags_.size());
  for (const auto& [key, t] : tags_) out.push_back(t);
  return out;
}

size_t TagRegistry::Restore(std::vector<TagInfo> tags) {
  std::sort(tags.begin(), tags.end(), [](const TagInfo& a, const TagInfo& b) {
    return std::tie(a.job, a.complete_unix_ns, a.tag) < std::tie(b.job, b.complete_unix_ns, b.tag);
  });
  MutexLock lock(&mu_);
  for (const TagInfo& t : tags)  // each job's numbering keeps its epoch (rows of an older server have none)
    if (t.epoch) EpochOf(t.job, t.epoch);
  for (TagInfo& t : tags) t.epoch = EpochOf(t.job);
  std::vector<TagInfo> unnumbered;
  for (TagInfo& t : tags) {
    if (t.version == 0 || VersionTaken(t.job, t.tag, t.version)) {
      unnumbered.push_back(std::move(t));
      continue;
    }
    tags_[{t.job, t.tag}] = std::move(t);
  }
  for (TagInfo& t : unnumbered) {
    tags_.erase({t.job, t.tag});
    t.version = NextVersion(t.job);
    tags_[{t.job, t.tag}] = std::move(t);
  }
  return tags_.size();
}

size_t TagRegistry::size() const {
  MutexLock lock(&mu_);
  return tags_.size();
}

}  // namespace tce
