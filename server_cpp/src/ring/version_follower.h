// VersionFollower: this node's side of following a job whose versions are
// published on other nodes (docs/weights.md): an inference node learns each
// new version of a trainer's job from the job's nodes, and brings the files
// its readers ask for into its own cache, once each, from those nodes.
//
// A local user asks to follow a job (Follow) naming the sources (peer
// endpoints, asked in order). This node asks them as itself: a source
// answers a node the job's owner granted (PeerVersion, checked against the
// endpoint the link authenticated), whatever uid asked here. Here the job
// is this server's own (NodeGrants::AddFollower: never the uid a source
// names) and each local user that follows it may read its versions. The
// version a source names is recorded here (PeerVersions::AdoptFollowed) and
// one watcher thread per job then asks the sources for each newer version,
// holding the question open at the source (no polling), and records each
// one as it comes; after a round no source answered it pauses, longer each
// time (Watch). Readers here wait for, lease and read versions as they
// would on the trainer's node.
//
// A version's files are brought on demand (Fetch, from AcquireVersion): each
// file this node does not hold is read from the first source that gives it
// in ranges of at most kMaxRangeLength, each checked against its CRC-32, into
// a buffer of the cache, the whole file then checked against the digest of
// the node that published the version (TagFile.crc32), and kept as a
// replica (never persisted or backed up; evictable once unleased).
// Concurrent readers asking for the same file wait for the one transfer. A
// source that fails mid-file is left for the next, which gives the rest.
//
// Pipelined: a file in transfer here is served to the nodes that follow
// this one (OpenRange) as its ranges land, so a chain of inference nodes
// carries a version at about the speed of one link, each node a range
// behind the one before. A following node that asks for a file of a
// version this node knows but does not hold starts its transfer here (pull
// through), so the chain fills whether or not this node's own readers
// asked yet.
//
// Trust: sources are authenticated peers (the cluster token); what they say
// is checked here (names, the version's file list and sizes, every byte's
// CRC and every file's publisher's digest, the nodes it says are granted, a
// version's number against the newest of its epoch: TagRegistry::Follow);
// no uid a source names is taken. Thread-safe.
#pragma once

#include <sys/types.h>
#include <unistd.h>

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "cache/ring_store.h"
#include "common/clock.h"
#include "common/mutex.h"
#include "common/status.h"
#include "ring/link_breaker.h"
#include "ring/peer_key.h"
#include "ring/range_reader.h"

namespace tce {

struct VersionFollowerOptions {
  std::string self;  // our advertised peer endpoint
  PeerKey key;       // the cluster token (and this node's certificate)
  std::chrono::milliseconds io_timeout{30000};
  // How long a watcher's question stays open at a source (at most the
  // source's PeerServer::kMaxVersionWaitMs); the pause after a round no
  // source answered, doubled after each such round up to retry_max.
  std::chrono::milliseconds hold{15000};
  std::chrono::milliseconds retry{1000};
  std::chrono::milliseconds retry_max{60000};
  size_t max_jobs = 64;          // jobs followed at once (max_follows)
  size_t max_jobs_per_uid = 8;   // of those, the jobs one local user follows (max_follows_per_uid)
  uid_t owner = ::geteuid();  // whose a followed job is here: this server's
  // (a pull-through transfer is bounded by its links' timeouts and this)
  LinkBreaker* breaker = nullptr;
  Clock* clock = Clock::Real();
};

// A followed job as `tce status` shows it.
struct FollowedJobInfo {
  std::string job;
  std::vector<std::string> sources;
  uint64_t version = 0;   // the newest learned
  uint64_t failures = 0;  // rounds in a row no source answered (0: following)
  std::string last_error;
  std::chrono::milliseconds retry_in{0};  // when failing: until the next round
};

class VersionFollower {
 public:
  // `grants`: the Cache's publication (who may read what it follows).
  VersionFollower(PeerVersions* cache, NodeGrants* grants, RangeReader* ranges, VersionFollowerOptions options);
  ~VersionFollower();  // Stop()

  // Follows `job` for the local user `uid`: the first source that answers
  // says whether this node may read the job's versions (PERMISSION_DENIED
  // with the source's reason) and gives the newest (*newest: version 0 when
  // it has none yet); `uid` may read them here. Later calls for the job add
  // their user and sources. Each user follows at most max_jobs_per_uid
  // jobs, the node at most max_jobs (RESOURCE_EXHAUSTED beyond). No source
  // is asked, or waited for, past `deadline` (the caller's: then
  // DEADLINE_EXCEEDED, with what the sources asked so far said).
  Status Follow(const std::string& job, std::vector<std::string> sources, uid_t uid, Clock::TimePoint deadline,
                TagInfo* newest) EXCLUDES(mu_);
  bool Follows(const std::string& job) EXCLUDES(mu_);
  // The jobs this node follows that `uid` follows (every one for `admin`).
  std::vector<FollowedJobInfo> Jobs(bool admin, uid_t uid) EXCLUDES(mu_);
  // Brings `paths` (files of `tag`, a version of a followed job) here,
  // those this node does not hold (the caller checked its reader). Returns
  // once each is here, or the first failure (naming the file and the
  // sources' reasons); `deadline` bounds the asking of sources.
  Status Fetch(const TagInfo& tag, const std::vector<std::string>& paths, Clock::TimePoint deadline)
      EXCLUDES(mu_);
  // For a following node's ranged read (the peer port checked its grant):
  // bytes [offset, offset + length) of `path` of the version recorded here
  // as `tag`, from its transfer to this node, started now if none is under
  // way and `job` is followed here. Waits (up to io_timeout) for the range
  // to land; then *fd is a new read-only fd of the buffer and *size the
  // file's size, and `Close(job, path)` must follow the read. NOT_FOUND when
  // this node neither has nor is bringing that file.
  Status OpenRange(const std::string& job, const std::string& tag, const std::string& path, uint64_t offset,
                   uint64_t length, int* fd, uint64_t* size) EXCLUDES(mu_);
  void CloseRange(const std::string& job, const std::string& path) EXCLUDES(mu_);
  // Ends the watchers (and the transfers, through the breaker).
  void Stop() EXCLUDES(mu_);

 private:
  struct Job {
    std::vector<std::string> sources;
    std::set<uid_t> users;  // the local users that follow it
    uint64_t newest = 0;    // the newest version learned, of numbering `epoch`
    uint64_t epoch = 0;
    uint64_t failures = 0;  // rounds in a row no source answered
    std::string last_error;
    Clock::TimePoint retry_at{};  // the next round, when failing
    std::thread watcher;
  };
  // RESOURCE_EXHAUSTED when `uid` may not follow one more job, or this
  // node no new one.
  Status Admit(const std::string& job, uid_t uid) REQUIRES(mu_);
  // One PeerVersion to `source` for a version above `after` of numbering
  // `epoch` (any version of another), its link's handshake and every send
  // and receive bounded by `timeout`; *nodes: those the job's owner granted
  // (also with DEADLINE_EXCEEDED: it held the question, nothing newer came).
  Status Ask(const std::string& source, const std::string& job, uint64_t after, uint64_t epoch,
             std::chrono::milliseconds hold, std::chrono::milliseconds timeout, TagInfo* out,
             std::vector<std::string>* nodes);
  // `tag` (adopted) is the newest the job's watcher knows, unless one of
  // its numbering is newer.
  static void Learned(Job* j, const TagInfo& tag);
  // The watcher: rounds of questions, a pause growing after each round no
  // source answered (options_.retry doubling to retry_max, on the clock).
  void Watch(std::string job) EXCLUDES(mu_);
  // One round: the sources in order until one answers (a newer version,
  // recorded, or nothing newer within the hold); else why none did.
  Status Round(const std::string& job, const std::vector<std::string>& sources, uint64_t after, uint64_t epoch)
      EXCLUDES(mu_);
  // A transfer in flight, as downstream readers see it.
  struct Transfer {
    int fd = -1;          // the buffer's memfd (a dup, owned), read-only use
    uint64_t size = 0;
    uint64_t landed = 0;  // bytes [0, landed) are in the buffer and checked
    bool ended = false;   // done or failed: no more bytes land
    int readers = 0;      // downstream reads under way (the buffer stays until they end)
  };
  // Bytes [0, file.size) of `file` into `to`, from sources[first], the next
  // giving the rest where one stops; returns how many landed (their CRC-32
  // in *crc, the sources that gave them in *from; why others stopped added
  // to *why).
  uint64_t Bring(const TagInfo& tag, const TagFile& file, const std::vector<std::string>& sources, size_t first,
                 unsigned char* to, Clock::TimePoint deadline, uint32_t* crc, std::string* from, std::string* why)
      EXCLUDES(mu_);
  // One file, from the sources in order (the caller marked it in fetching_),
  // checked against the digest of the node that published it (file.crc32):
  // bytes that do not match are brought again from the next source on.
  Status FetchFile(const TagInfo& tag, const TagFile& file, const std::vector<std::string>& sources,
                   Clock::TimePoint deadline) EXCLUDES(mu_);
  // Fetch of one file for a downstream reader (a thread of its own).
  void PullThrough(uint64_t id, TagInfo tag, TagFile file) EXCLUDES(mu_);
  // Starts a pull-through transfer of (job, tag's path), unless one is
  // under way; NOT_FOUND when this node does not follow the job or does
  // not learn that version in time.
  Status StartPull(const std::string& job, const std::string& tag, const std::string& path) REQUIRES(mu_);

  static constexpr std::chrono::minutes kPullDeadline{10};
  static constexpr std::chrono::seconds kLearnWait{5};  // for a version a following node knows already
  PeerVersions* const cache_;
  NodeGrants* const grants_;
  RangeReader* const ranges_;
  const VersionFollowerOptions options_;
  Mutex mu_;  // taken before the cache's own lock, never after it
  CondVar changed_;  // a transfer ended, or the follower stops
  bool stopping_ GUARDED_BY(mu_) = false;
  std::map<std::string, Job> jobs_ GUARDED_BY(mu_);
  std::set<std::pair<std::string, std::string>> fetching_ GUARDED_BY(mu_);  // (job, path) in transfer
  std::map<std::pair<std::string, std::string>, Transfer> transfers_ GUARDED_BY(mu_);
  std::map<uint64_t, std::thread> pulls_ GUARDED_BY(mu_);  // pull-through transfers
  std::vector<uint64_t> pulls_done_ GUARDED_BY(mu_);       // to join
  uint64_t next_pull_ GUARDED_BY(mu_) = 0;
};

}  // namespace tce
