// Replicator: worker threads that do the ring's work (ring/backup_queue.h)
// off the training rank's critical path: back committed files and complete
// tags up to the ring successor, tell a peer to drop a copy, recover a job's
// files and tags. Each backup: the record
// CRCs (computed here, read-only, when persistence has not filled them in
// yet), a PeerBackup header on an authenticated link, the bytes through the
// transport, and the peer's verdict. A failure (peer down, link cut, refused)
// puts the file back in the queue and the worker backs off (doubling, up to
// max_backoff); it never blocks saves, persistence or eviction: the pin on the
// buffer lasts one attempt. Links are kept per peer and re-made on failure.
#pragma once

#include <chrono>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "cache/ring_store.h"
#include "common/clock.h"
#include "common/log_limiter.h"
#include "common/metrics.h"
#include "common/mutex.h"
#include "common/progress_board.h"
#include "persist/crc.h"
#include "ring/backup_queue.h"
#include "ring/backup_store.h"
#include "ring/link_breaker.h"
#include "ring/peer_link.h"
#include "ring/prefetch_queue.h"
#include "ring/restore_plan.h"
#include "ring/tag_barrier.h"
#include "ring/transport.h"

namespace tce {
namespace v1 {
class PeerRequest;
}

struct ReplicatorOptions {
  std::string self;   // our advertised peer endpoint
  PeerKey key;  // the cluster token (and this node's certificate)
  int threads = 1;
  std::chrono::milliseconds backoff{200};
  std::chrono::milliseconds max_backoff{10000};
  std::chrono::milliseconds io_timeout{30000};
  TransferMetrics* metrics = nullptr;  // observes each backup sent or failed (optional)
  // The copies this server keeps for its predecessor (optional): a load that
  // misses reads them first, before asking any peer.
  BackupStore* held = nullptr;
  // Ends every wait on a peer when the server stops (optional).
  LinkBreaker* breaker = nullptr;
  Clock* clock = Clock::Real();  // what backoff and timings are measured on
  // How often held tag markers' files are asked about (ring/tag_barrier.h).
  std::chrono::milliseconds marker_interval{500};
  // Prefetch: a job's ring set on a node that holds none of its files, or a
  // client's Prefetch, starts reading this node's share of a checkpoint.
  bool prefetch = true;
  // Cooperative restore itself (false: a load that no node's memory serves
  // reads storage on its own node, and nothing is prefetched).
  bool cooperative = true;
};

class Replicator {
 public:
  // `queue`: the ring's work, which the Cache feeds (CacheOptions::
  // backup_feed); made before the Cache, it outlives the Replicator.
  Replicator(RingStores stores, BackupQueue* queue, Transport* transport, ReplicatorOptions options);
  ~Replicator();
  void Start();
  void Stop();
  // A load missed (job, path): fetch it into the cache from where the ring
  // keeps it: the copy this server holds for its predecessor, else a ring
  // member's copy or its own file in memory, the successor first. NOT_FOUND
  // if none has it; DATA_LOSS if the copy is corrupt or differs from
  // metadata. Held nowhere, a file under a storage root is read from
  // storage by the node the restore plan names (LoadByPlan) and pulled
  // from there. `from`: where the bytes came from (a peer, or storage by
  // this node). A peer that does not answer is marked down for the job
  // (RestorePlans::MarkDown: asked nothing for a while); no wait on a peer
  // lasts past `deadline` (the caller's: DEADLINE_EXCEEDED naming the peer).
  // Called by RPC threads.
  Status FetchForLoad(const std::string& job, const std::string& path, LoadFrom* from = nullptr,
                      Clock::TimePoint deadline = Clock::TimePoint::max());
  // The cooperative restore (cooperative_load.cc, docs/ring.md): the node
  // of the job's ring that RestorePlans names reads (job, path) from
  // storage; this node pulls the file from it (or, with `stage`, only has
  // it read there: ranged reads then find it in that node's memory). This
  // node reads storage itself when the plan names it, when the copy from
  // the owner arrives corrupt, or when every other node is down; a node
  // that does not answer is left out and its share goes to the others; a
  // reader that stops answering is marked down too, and its claims dropped
  // here and at the plan's node (PeerFetch's `down`), so its files are read
  // by the others. NOT_FOUND when the path is under no storage root or
  // storage has no such file; the owner's storage error otherwise;
  // DEADLINE_EXCEEDED when `deadline` passed while a peer was awaited.
  Status LoadByPlan(const std::string& job, const std::string& path, bool stage, LoadFrom* from = nullptr,
                    Clock::TimePoint deadline = Clock::TimePoint::max());
  // Queues the read of this node's share (by the restore plan) of `paths`,
  // or of the files of `dir` on storage, into the cache, for the prefetch
  // workers (kPrefetchThreads), fair between the uids owning the jobs
  // (ring/prefetch_queue.h); with `only_if_empty`, only while this node
  // holds none of the job's files in memory (a restart). False when
  // nothing was queued (no ring of several nodes, prefetch off, nothing
  // under a storage root named, the same one queued already, or the
  // queue's share of the job's uid, or the queue, full).
  bool Prefetch(const std::string& job, const std::string& dir, std::vector<std::string> paths,
                bool only_if_empty = false);
  static constexpr int kPrefetchThreads = 2;
  // The prefetches and ring restores running now, with their progress
  // (common/progress_board.h): all of them (`all`), else those of `uid`'s jobs.
  std::vector<OperationProgress> Running(bool all, uid_t uid) const { return progress_.Running(all, uid); }
  // Whether `peer` is marked down for `job` (loads ask it nothing for a while).
  bool PeerDown(const std::string& job, const std::string& peer) { return plans_.IsDown(job, peer); }
  // `peer` stopped answering a load of `job`: marked down, its claims here dropped.
  void MarkPeerDown(const std::string& job, const std::string& peer);

 private:
  void Loop();
  void PrefetchLoop();
  // One step of `p`: its listing, or its next file of this node's share;
  // true when it is finished.
  bool PrefetchStep(uid_t uid, PrefetchJob* p);
  // One job of each kind: a file to the successor, a copy a peer lets go of.
  Status Backup(const BackupJob& job, std::map<std::string, std::unique_ptr<PeerLink>>* links);
  Status Drop(const DropCopy& drop, std::map<std::string, std::unique_ptr<PeerLink>>* links);
  Status NotePersisted(const PersistedCopy& copy, std::map<std::string, std::unique_ptr<PeerLink>>* links);
  // Sends `req` to `peer` on this thread's link and reads the PeerReply.
  Status Ask(const std::string& peer, const v1::PeerRequest& req,
             std::map<std::string, std::unique_ptr<PeerLink>>* links);
  // A complete tag this node recorded, for `peer` (the successor) to hold.
  Status SendTag(const TagInfo& tag, int32_t node, const std::string& peer,
                 std::map<std::string, std::unique_ptr<PeerLink>>* links);
  // The peer's answer to a backup or a drop.
  Status Verdict(PeerLink* link, const std::string& peer);
  // The bytes, checksummed chunk by chunk as they go, then the CRCs.
  Status SendWithChecksums(PeerLink* link, const BackupJob& job);
  // An authenticated link to `peer`, with the transport's lanes (up by
  // `deadline`, when one is given).
  Status Connect(const std::string& peer, std::unique_ptr<PeerLink>* out,
                 Clock::TimePoint deadline = Clock::TimePoint::max());
  Status Link(const std::string& peer, std::map<std::string, std::unique_ptr<PeerLink>>* links,
              PeerLink** out);
  // Pulls this node's copies back from the successor, then asks the
  // predecessor to back up to us again.
  Status Recover(const RecoverJob& job, std::map<std::string, std::unique_ptr<PeerLink>>* links);
  // Logs how a recovery went: at WARNING, with the tags metadata names,
  // when the ring gave back nothing or less than this node held.
  void ReportRecovery(const RecoverJob& job, int pulled, int listed, uint64_t peer_own);
  // (job, path) as `peer` holds it, fetched into a new cache buffer and
  // checked. kLoad: read from storage there if held nowhere (PeerFetch's
  // `load`); kStage: that, and nothing is pulled. With `reader`, the peer
  // may answer instead which node reads the file (PeerFetch's `claim`):
  // OK with *reader set, nothing pulled; `down`: a node the peer is told
  // this one found not answering (its claims are dropped there first).
  enum class PullMode { kCopy, kLoad, kStage };
  Status Pull(PeerLink* link, const std::string& job, const std::string& peer, const std::string& path,
              PullMode mode = PullMode::kCopy, std::string* reader = nullptr, const std::string& down = "");
  // Runs `fn` on a link to `peer` kept for loads (RPC threads) between
  // exchanges, so a load costs no handshake; a new one when none is idle.
  // The link goes back to the pool when `fn` ended in step with the peer
  // (OK, NOT_FOUND, FAILED_PRECONDITION); a kept link that fails at once is
  // made again once (the peer may have restarted; not one that timed
  // out). Every wait on the link ends by `deadline`.
  Status OnLink(const std::string& peer, const std::function<Status(PeerLink*)>& fn,
                Clock::TimePoint deadline = Clock::TimePoint::max());
  // Pull (kLoad or kStage) from `node` on a link of the pool.
  Status PullFrom(const std::string& node, const std::string& job, const std::string& path, bool stage,
                  std::string* reader = nullptr, Clock::TimePoint deadline = Clock::TimePoint::max(),
                  const std::string& down = "");
  // A load's wait on `peer` failed with `s` (UNAVAILABLE or
  // DEADLINE_EXCEEDED): DEADLINE_EXCEEDED naming it when the caller's
  // deadline passed (it may only be slow); else it is marked down for the
  // job, its claims here dropped, and OK returned (the load goes on).
  Status PeerFailedLoad(const std::string& job, const std::string& path, const std::string& peer,
                        const std::string& as, const Status& s, Clock::TimePoint deadline);
  // (job, path) from this server's own BackupStore, if it holds a copy sent
  // by a member of the job's ring: copied into a new cache buffer, checked.
  Status PullHeld(const std::string& job, const std::string& path);
  // Copies `size` bytes from `src` into `mem`, feeding them to `crcs`.
  static Status CopyInto(const Buffer& mem, const unsigned char* src, uint64_t size, RecordCrcs* crcs);
  bool SleepUnlessStopping(std::chrono::milliseconds d);

  RingStore* const cache_;
  RingMembers* const members_;  // the job's ring and uid
  RingBackups* const backups_;  // what the workers send and how it went
  RecoveryStore* const recovery_;
  StorageLoads* const loads_;  // the cooperative restore's reads of storage
  RestoreTracker* const restores_;  // ends what a recovery began
  BackupQueue* const queue_;  // fed by the cache (CacheOptions::backup_feed)
  Transport* const transport_;
  const ReplicatorOptions options_;
  ProgressBoard progress_;  // before what holds its entries (prefetches_), which go first
  std::vector<std::thread> threads_;
  TagBarrier barrier_;  // markers of object storage wait for the other nodes' files
  RestorePlans plans_;  // who reads which file from storage in a cooperative restore
  Mutex mu_;
  CondVar cv_;
  bool stop_ GUARDED_BY(mu_) = false;
  PrefetchQueue prefetches_;
  LogLimiter prefetch_log_;  // prefetches' lines: one user's flood of them stays a few lines
  Mutex pool_mu_;
  std::map<std::string, std::vector<std::unique_ptr<PeerLink>>> pool_ GUARDED_BY(pool_mu_);  // OnLink
};

}  // namespace tce
