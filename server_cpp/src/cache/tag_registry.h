// TagRegistry: the complete checkpoint tags of every job, keyed by (job, tag).
//
// A tag is recorded once every rank of a checkpoint committed its files
// (rank 0 reports it); re-recording a tag replaces it, and tags are never
// removed. Each recorded tag is a published version of its job: versions
// count 1, 2, ... per job in the order tags are recorded (a tag recorded
// again gets the next number), never reused, so a reader that saw version
// v knows any tag numbered above v is newer. The registry only keeps them: who may record or read a job's tags
// is the Cache's question, and so is telling the metadata store.
//
// Each job's numbering has an *epoch*: a random id picked when the job's
// numbering starts here afresh (its first tag on a server that has none of
// its tags: a new job, a server whose state was lost), stored with every
// tag and kept across restarts (metadata) and recoveries (tags pulled back
// from the ring keep theirs). A node that follows the job (cache_follow)
// keeps its source's epoch: a version of another epoch starts its numbering
// again, lower numbers included, and a version that jumps more than
// kMaxVersionJump above the newest of its epoch here is refused.
//
// A file's digest (TagFile.crc32) is the publishing node's alone: a tag
// recorded here (Complete, Adopt) keeps none it came with, and gets one per
// file when this node computes it (SetDigests); a followed job's versions
// keep their source's (Follow).
//
// Thread-safe (its own mutex, a leaf: nothing is called while it is held).
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "cache/cache_types.h"
#include "common/mutex.h"

namespace tce {

class TagRegistry {
 public:
  // The most a followed job's version may be above the newest this node
  // knows in its epoch (0 for an epoch it has not seen): about 12 days of a
  // version a second. Beyond it the source is wrong or lying, and a number
  // that large would leave every real version below it unseen.
  static constexpr uint64_t kMaxVersionJump = uint64_t{1} << 20;

  // Checks a tag as a client reported it and sorts its files by (rank,
  // path). Returns "" when it is valid, else why not (for INVALID_ARGUMENT).
  static std::string Check(TagInfo* tag);

  // Records `tag`, complete at `complete_unix_ns`, replacing an earlier
  // record of the same (job, tag), as the job's next version; returns what
  // was recorded.
  TagInfo Complete(TagInfo tag, int64_t complete_unix_ns);
  // The job's tags, oldest first (by completion time, then name).
  std::vector<TagInfo> List(const std::string& job) const;
  // Every tag (for a fresh metadata database), in (job, tag) order.
  std::vector<TagInfo> All() const;
  // A tag recorded elsewhere (pulled back from the ring), complete when it
  // says: kept unless the (job, tag) recorded here is as new or newer.
  // It keeps its version unless it has none or one this job already
  // numbered another tag with (then it gets the next). Returns whether it
  // was kept.
  bool Adopt(TagInfo tag);
  // The tag recorded as (job, tag), if any.
  bool Find(const std::string& job, const std::string& tag, TagInfo* out) const;
  // Tags recorded before a restart (from metadata); returns how many are
  // held. Those without a version (recorded by an older server) are
  // numbered after the job's others, in completion order.
  size_t Restore(std::vector<TagInfo> tags);
  // A version of a job this node follows, as its source numbered it:
  // returns "" (*kept: whether it was recorded, as Adopt) unless it jumps
  // too far (kMaxVersionJump) or has no epoch (then why not). A version of
  // an epoch other than the job's here forgets the job's tags first: the
  // source's numbering started afresh.
  std::string Follow(TagInfo tag, bool* kept);
  // The job's newest version (highest number) above `after`; false if none.
  // Where the job's numbering started afresh here (Follow) and `after` is a
  // number of an earlier epoch above every current one, the newest.
  bool Newest(const std::string& job, uint64_t after, TagInfo* out) const;
  // The job's epoch here (0: none yet).
  uint64_t Epoch(const std::string& job) const;
  // Digests this node computed of its own files of (job, tag), as
  // recorded with `version`: kept while that tag is that version.
  void SetDigests(const std::string& job, const std::string& tag, uint64_t version,
                  const std::map<std::string, uint32_t>& crc32);
  // The job's tag numbered `version`; false if none.
  bool FindVersion(const std::string& job, uint64_t version, TagInfo* out) const;
  size_t size() const;
  // How many tags the job has; the name of its oldest other than `except`
  // (false: none).
  size_t Count(const std::string& job) const;
  bool Oldest(const std::string& job, const std::string& except, std::string* tag) const;
  // Forgets the (job, tag) record, moved to *out if not null; false if
  // there was none.
  bool Remove(const std::string& job, const std::string& tag, TagInfo* out = nullptr);

 private:
  // The number after the job's highest version.
  uint64_t NextVersion(const std::string& job) const REQUIRES(mu_);
  // The job's version numbers in use, other than (job, tag)'s own.
  bool VersionTaken(const std::string& job, const std::string& tag, uint64_t version) const
      REQUIRES(mu_);
  // The job's epoch, picked now (and `hint` when it is one) if it has none.
  uint64_t EpochOf(const std::string& job, uint64_t hint = 0) REQUIRES(mu_);
  bool AdoptLocked(TagInfo tag) REQUIRES(mu_);

  mutable Mutex mu_;
  std::map<std::pair<std::string, std::string>, TagInfo> tags_ GUARDED_BY(mu_);
  std::map<std::string, uint64_t> epochs_ GUARDED_BY(mu_);
  // A followed job whose numbering started afresh: the highest number of
  // its earlier epochs.
  std::map<std::string, uint64_t> restarted_below_ GUARDED_BY(mu_);
};

}  // namespace tce
