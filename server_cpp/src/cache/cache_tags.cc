// Cache: complete tags (the job's published versions): recording one a
// client reports, within the bounds on what a client can make the server
// remember (MetadataQuota, max_tags_per_job), listing, forgetting.
#include <set>

#include "cache/cache.h"
#include "common/logging.h"

namespace tce {
namespace {

// A tag a client records names only files its job holds here, or of ranks
// that saved none of the tag here (another node's): NOT_FOUND naming the
// file otherwise.
Status CheckTagFiles(const TagInfo& tag, const std::map<FileKey, FileInfo>& files) {
  // The ranks that committed files of this tag here: a file of such a rank
  // must be here too; a rank with none here saved on another node.
  std::set<int32_t> local;
  for (auto it = files.lower_bound({tag.job, ""}); it != files.end() && it->first.first == tag.job; ++it)
    if (it->second.tag == tag.tag && it->second.state != FileState::kDiscarded) local.insert(it->second.rank);
  size_t held = 0;
  for (const TagFile& tf : tag.files) {
    auto f = files.find({tag.job, tf.path});
    if (f != files.end() && f->second.state != FileState::kPending && f->second.state != FileState::kDiscarded) {
      ++held;
    } else if (local.count(tf.rank)) {
      return Status::NotFound("tag '" + tag.tag + "' names " + tf.path + " of rank " + std::to_string(tf.rank) +
                              ", which job '" + tag.job + "' does not hold here, although rank " +
                              std::to_string(tf.rank) + " saved files of the tag here");
    }
  }
  if (held == 0)
    return Status::NotFound("tag '" + tag.tag + "' names no file job '" + tag.job +
                            "' holds on this server: a tag is recorded on a node that saved files of it");
  return Status::OK();
}

}  // namespace

Status Cache::CommitTag(const std::string& session, TagInfo tag, TagInfo* out) {
  const std::string why = TagRegistry::Check(&tag);
  MutexLock lock(&mu_);
  Status s = sessions_.Check(session);
  // No claim: a job nobody owns holds no file, so CheckTagFiles refuses it.
  if (s.ok() && why.empty())
    s = CheckAccess(session, tag.job, "commit tag '" + tag.tag + "' into job '" + tag.job + "'");
  if (!s.ok()) return s;
  if (why.empty()) s = CheckTagFiles(tag, files_);
  if (s.ok() && why.empty()) s = MakeRoomForTag(tag);
  if (!s.ok() || !why.empty()) {
    const std::string refusal = why.empty() ? s.message() : why;
    TCE_LOG(kWarning, "cache") << "refused tag job=" << tag.job << " tag=" << tag.tag << ": " << refusal;
    return why.empty() ? s : Status::InvalidArgument(why);
  }
  TCE_LOG(kInfo, "cache") << "tag complete job=" << tag.job << " tag=" << tag.tag
                          << " files=" << tag.files.size() << " world_size=" << tag.world_size;
  // Under mu_, so that RecordAll sees a tag either recorded here or in the registry.
  *out = tags_.Complete(std::move(tag), clock_->UnixNowNs());
  quota_.Force(TagOwner(out->job), MetadataQuota::TagBytes(*out));  // MakeRoomForTag made room
  std::map<std::string, uint64_t>& held = published_[{out->job, out->tag}];
  held.clear();
  for (const TagFile& tf : out->files) {
    auto f = files_.find({out->job, tf.path});
    if (f != files_.end()) held[tf.path] = f->second.version;
  }
  ++counts_.versions_published;
  publication_->Changed();  // readers waiting for a newer version
  TCE_LOG(kInfo, "cache") << "published job=" << out->job << " tag=" << out->tag
                          << " version=" << out->version;
  if (meta_) meta_->RecordTag(*out);
  if (!waiting_markers_.empty()) ReleaseMarkers(out->job);  // a marker may have waited for this record
  if (!rings_.Successor(out->job).empty()) backups_->SendTag(TagCopy{out->job, out->tag});
  if (tag_feed_) tag_feed_->TagComplete(out->job);
  return Status::OK();
}

Status Cache::MakeRoomForTag(const TagInfo& tag) {
  const uid_t owner = TagOwner(tag.job);
  TagInfo earlier;  // the tag's own earlier record, which the new one replaces
  const bool again = tags_.Find(tag.job, tag.tag, &earlier);
  const uint64_t freed = again ? MetadataQuota::TagBytes(earlier) : 0;
  const uint64_t need = MetadataQuota::TagBytes(tag);
  const uint64_t extra = need > freed ? need - freed : 0;
  const size_t max_tags = std::max<size_t>(1, quota_.limits().max_tags_per_job);
  if (!quota_.Fits(owner, extra)) {  // a record that cannot fit, even alone, forgets nothing
    uint64_t others = 0;
    for (const TagInfo& t : tags_.List(tag.job))
      if (t.tag != tag.tag) others += MetadataQuota::TagBytes(t);
    if (!quota_.Fits(owner, extra > others ? extra - others : 0))
      return quota_.Charge(owner, extra,
                           "tag '" + tag.tag + "' of job '" + tag.job + "' (" + std::to_string(tag.files.size()) +
                               " files)");
  }
  // The job's oldest other tags go first: beyond max_tags_per_job, and while
  // the new record does not fit its owner's share or the budget.
  for (;;) {
    const bool over = tags_.Count(tag.job) + (again ? 0 : 1) > max_tags;
    if (!over && quota_.Fits(owner, extra)) break;
    std::string oldest;
    if (!tags_.Oldest(tag.job, tag.tag, &oldest)) break;  // (checked above: it fits alone)
    DropTag(tag.job, oldest, over ? "max_tags_per_job" : "the newest tag needed its room in metadata_budget");
  }
  quota_.Credit(owner, freed);  // CommitTag counts the new record whole
  return Status::OK();
}

void Cache::TrimTags(const std::string& job) {
  const size_t max_tags = std::max<size_t>(1, quota_.limits().max_tags_per_job);
  std::string oldest;
  while (tags_.Count(job) > max_tags && tags_.Oldest(job, "", &oldest)) DropTag(job, oldest, "max_tags_per_job");
}

uint64_t Cache::JobTagBytes(const std::string& job) const {
  uint64_t bytes = 0;
  for (const TagInfo& t : tags_.List(job)) bytes += MetadataQuota::TagBytes(t);
  return bytes;
}

uid_t Cache::TagOwner(const std::string& job) const {
  uid_t uid = 0;
  JobUidLocked(job, &uid);
  return uid;
}

void Cache::DropTag(const std::string& job, const std::string& tag, const std::string& why) {
  TagInfo gone;
  if (!tags_.Remove(job, tag, &gone)) return;
  quota_.Credit(TagOwner(job), MetadataQuota::TagBytes(gone));
  published_.erase({job, tag});
  TagInfo record;  // recorded as never completed: a restart does not load it
  record.job = job;
  record.tag = tag;
  if (meta_) meta_->RecordTag(record);
  TCE_LOG(kInfo, "cache") << "forgot tag job=" << job << " tag=" << tag << " (" << why << ")";
}

void Cache::CountTag(const TagInfo* before, const std::string& job, const std::string& tag) {
  TagInfo now;
  if (before) quota_.Credit(TagOwner(job), MetadataQuota::TagBytes(*before));
  if (tags_.Find(job, tag, &now)) quota_.Force(TagOwner(job), MetadataQuota::TagBytes(now));
}

std::vector<TagInfo> Cache::ListTags(const std::string& job) { return tags_.List(job); }

Status Cache::ListTags(const std::string& session, const std::string& job, std::vector<TagInfo>* out) {
  {
    MutexLock lock(&mu_);
    Status s = CheckAccess(session, job, "list the tags of job '" + job + "'");
    if (!s.ok()) return s;
  }
  *out = ListTags(job);  // (ownership never changes once set)
  return Status::OK();
}

void Cache::RestoreTags(std::vector<TagInfo> tags) {
  const size_t n = tags_.Restore(std::move(tags));
  std::set<std::string> jobs;
  for (const TagInfo& t : tags_.All()) {
    quota_.Force(TagOwner(t.job), MetadataQuota::TagBytes(t));
    jobs.insert(t.job);
  }
  size_t dropped = tags_.size();  // beyond max_tags_per_job (the setting was lowered): the oldest
  for (const std::string& job : jobs) TrimTags(job);
  dropped -= tags_.size();
  TCE_LOG(kInfo, "cache") << "re-indexed " << n - dropped << " complete tag(s) from metadata"
                          << (dropped ? " (" + std::to_string(dropped) + " beyond max_tags_per_job forgotten)" : "");
}

}  // namespace tce
