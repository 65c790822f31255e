// Cache: the node's checkpoint memory. It owns every buffer, hands buffers to
// client sessions for writing, keeps committed files keyed by (job, path),
// recycles freed buffers and keeps the total within a byte budget.
//
// With storage roots configured, every committed file is also queued for
// persistence (see persist/persister.h), and only paths under the roots are
// accepted. Without roots the cache is memory only.
//
// Each kind of caller sees it through its own interface: clients (rpc/)
// through ClientStore, whose header states the security contract,
// persistence through PersistSource (served by its Persistence component,
// cache/persistence.h), the ring through RingStore and, for its backups,
// RingBackups (served by its Backups component, cache/backups.h), for what
// it brings back and what peers read here, RecoveryStore (served by its
// Recovery component, cache/recovery.h). A job's ring membership is its
// Rings component's (cache/rings.h): clients set a ring through
// ClientRings, the ring asks RingMembers. The fd socket sees it through
// SessionStore (served by its Sessions component, cache/sessions.h).
//
// All public methods are thread-safe: they take the one mutex, `mu_` (they
// are EXCLUDES(mu_); the private helpers that run under it are REQUIRES(mu_),
// checked by clang, see common/thread_annotations.h). Creating a memfd (slow:
// fallocate zero-fills it) and filesystem checks happen outside the lock.
// New buffers come from the pre-faulted pool when there is one
// (buffer_pool.h); the pool's bytes count against the budget (the Cache's
// BudgetSide is its PoolBudget) but never stop an allocation: a new buffer takes the
// pool's memory first, and the pool sheds what no longer fits.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "cache/backup_feed.h"
#include "cache/backups.h"
#include "cache/buffer.h"
#include "cache/buffer_pool.h"
#include "cache/memory_backing.h"
#include "cache/memory_budget.h"
#include "cache/cache_types.h"
#include "cache/cache_buf.h"
#include "cache/cache_counters.h"
#include "cache/cache_options.h"
#include "cache/client_store.h"
#include "cache/job_owners.h"
#include "cache/meta_sink.h"
#include "cache/metadata_quota.h"
#include "cache/persist_feed.h"
#include "cache/persistence.h"
#include "cache/publication.h"
#include "cache/recovery.h"
#include "cache/replicas.h"
#include "cache/restore_tracker.h"
#include "cache/ring_store.h"
#include "cache/ring_table.h"
#include "cache/rings.h"
#include "cache/session_limits.h"
#include "cache/session_table.h"
#include "cache/sessions.h"
#include "common/log_limiter.h"
#include "common/mutex.h"
#include "common/single_flight.h"
#include "common/status.h"
#include "env/env.h"
#include "storage/object_roots.h"
#include "storage/object_store.h"
#include "cache/storage_access.h"
#include "cache/storage_check.h"
#include "cache/tag_registry.h"

namespace tce {

class Cache : public ClientStore,
              public RingStore {
 public:
  // Its settings and storage roots: cache/cache_options.h. The collaborators
  // made after it, because they take the Cache (the retention's tag
  // listener; the peer endpoint once bound, on its Rings), are set before
  // serving. The
  // persistence and backup feeds are made before it
  // (CacheOptions::persist_feed, backup_feed).
  explicit Cache(CacheOptions options);
  Cache(const Cache&) = delete;
  Cache& operator=(const Cache&) = delete;

  // (The interfaces take every argument; the defaults here serve the
  // daemon's and the tests' calls.)
  // ---- ClientStore (cache/client_store.h) ----
  Status Allocate(const AllocateRequest& req, AllocateResult* out) override EXCLUDES(mu_);
  Status Commit(const std::string& session, uint64_t allocation_id, std::vector<Record> records,
                FileInfo* out, bool zip_crc32 = true) override EXCLUDES(mu_);
  Status Abort(const std::string& session, uint64_t allocation_id) override EXCLUDES(mu_);
  Status Lookup(const std::string& session, const std::string& job, const std::string& path,
                bool lease, FileInfo* out, uint64_t* lease_id,
                std::vector<uint64_t>* unmap_buffer_ids) override EXCLUDES(mu_);
  Status Release(const std::string& session, const std::vector<uint64_t>& lease_ids,
                 const std::vector<uint64_t>& unmapped_buffer_ids) override EXCLUDES(mu_);
  Status Remove(const std::string& session, const std::string& job, const std::string& path,
                FileInfo* out) override EXCLUDES(mu_);
  Status List(const std::string& session, const std::string& job, const std::string& tag,
              std::vector<FileInfo>* out, bool check_storage = false) override EXCLUDES(mu_);
  Status CommitTag(const std::string& session, TagInfo tag, TagInfo* out) override EXCLUDES(mu_);
  Status ListTags(const std::string& session, const std::string& job,
                  std::vector<TagInfo>* out) override EXCLUDES(mu_);
  CacheStats Stats() override EXCLUDES(mu_);
  const StorageRoots& storage() const override { return *storage_; }
  Status Wait(const std::string& session, const std::string& job,
              const std::vector<std::string>& paths, std::chrono::milliseconds timeout,
              std::vector<FileInfo>* out, const CallerGone& gone = {}) override EXCLUDES(mu_);
  Status RetryFailed(const std::string& session, const std::string& job,
                     const std::vector<std::string>& paths, std::vector<FileInfo>* out) override EXCLUDES(mu_);

  // ---- RingStore (cache/ring_store.h) ----
  std::vector<HeldMarker> MarkersAwaitingPeers() override EXCLUDES(mu_);
  void PeersDurable(const FileKey& marker, uint64_t version) override EXCLUDES(mu_);
  std::vector<std::string> DurableOf(const std::string& job, const std::vector<std::string>& paths) override
      EXCLUDES(mu_);


  // ---- for the daemon (and tests) ----
  // Reports every file, tag and ring to the sink again (the metadata
  // database was lost and a fresh one must hold the full state).
  void RecordAll() EXCLUDES(mu_);
  // Re-indexes files and tags recorded before a restart (from metadata):
  // files on storage become EVICTED (loads read storage); the rest are
  // FAILED as lost. Of the tags, the oldest beyond max_tags_per_job are
  // forgotten (and that is recorded).
  void Restore(std::vector<FileInfo> files, std::vector<TagInfo> tags = {}) EXCLUDES(mu_);
  // ---- for the daemon (and tests), continued ----
  // The pool new buffers come from first (CacheOptions::prealloc; null:
  // none), for the daemon to start and stop its filler.
  BufferPool* pool() { return pool_.get(); }
  // The budget as a borrower of memory sees it (cache/memory_budget.h; the
  // RPC layer's ranged-read buffers): borrowed bytes count as held, like a
  // buffer's; a save cannot reclaim them (they come back when the borrower
  // frees them).
  MemoryBudget* memory_budget() { return &budget_side_; }
  // Writing committed files to storage (cache/persistence.h): the
  // persister's and the storage retention's PersistSource.
  Persistence* persistence() { return persistence_.get(); }
  // The client sessions and their leases (cache/sessions.h): the fd
  // socket's and the RPC layer's SessionStore.
  Sessions* sessions() { return &sessions_; }
  // Backing files up around the ring (cache/backups.h): the replicator's
  // and the peer port's RingBackups.
  Backups* backups() { return backups_.get(); }
  // What the ring brings back and what peers read of this node
  // (cache/recovery.h): the replicator's and the peer port's RecoveryStore.
  Recovery* recovery() { return recovery_.get(); }
  // Storage read on behalf of clients and the ring (cache/storage_access.h):
  // the RPC layer's StoredFiles, the ring's StorageLoads.
  StorageAccess* storage_access() { return storage_access_.get(); }
  // Who may read the published versions, and the readers' leases on them
  // (cache/publication.h): the RPC layer's VersionStore, the peer port's
  // and the follower's NodeGrants.
  Publication* publication() { return publication_.get(); }
  // Published versions across nodes (cache/replicas.h): the peer port's
  // and the version follower's PeerVersions.
  Replicas* replicas() { return replicas_.get(); }
  // The jobs being pulled back from the ring (CacheOptions::restores, or
  // the Cache's own): loads wait for them, the replicator ends them.
  RestoreTracker* restores() { return restores_.get(); }
  // The jobs' rings (cache/rings.h): the RPC layer's ClientRings, the
  // ring's RingMembers; the daemon sets the self endpoint and restores.
  Rings* rings() { return &rings_; }

  // The server stops: loads and listings waiting for a restore, and
  // readers waiting for a version, get UNAVAILABLE now (so the RPC server's
  // shutdown does not wait for them).
  void StopWaits();

  // Shutdown: new allocations are refused (UNAVAILABLE) from now on; saves
  // already allocated may still commit, loads are served as before.
  void StopAccepting() EXCLUDES(mu_);
  // What a drain still waits for: one line per file ("job=.. path=..: not
  // persisted" / "not backed up"), and whether allocations are in flight.
  std::vector<std::string> Unfinished(bool* allocations_in_flight) EXCLUDES(mu_);

 private:
  using BufState = CacheBufState;
  using Buf = CacheBuf;
  struct Allocation {
    uint64_t id = 0;
    std::string session;
    uint64_t buffer_id = 0;
    FileInfo file;
  };
  enum class Fate { kCommitted, kAborted };

  // Sessions::Check, then JobOwners::Check (or Claim) with the session's uid.
  Status CheckAccess(const std::string& session, const std::string& job, const std::string& what,
                     bool claim = false) REQUIRES(mu_);
  // SessionHost's steps (cache_sessions.cc), each under mu_: CloseSession
  // (its allocations, leases and mappings end, the session is forgotten;
  // false when there is no such session), and FdFor.
  bool CloseSessionHere(const std::string& session) EXCLUDES(mu_);
  Status FdForHere(const std::string& session, uint64_t buffer_id, int* fd, bool* writable, uint64_t* capacity,
                   bool keep_mapped) EXCLUDES(mu_);
  std::unique_ptr<SessionHost> MakeSessionSide();
  // Ends the lease and lets go of the buffer it held.
  void DropLease(uint64_t lease_id) REQUIRES(mu_);
  // Makes `mem` one of the cache's buffers (counted in used_; `created`: a
  // new one, not one lent out and given back); its state is the caller's.
  Buf& Install(std::unique_ptr<Buffer> mem, bool created = true) REQUIRES(mu_);
  // A buffer nobody holds any more: FREE for reuse, or destroyed when it
  // may not be reused (Buf::no_reuse). `buf` may be gone after.
  void FreeBuffer(Buf& buf) REQUIRES(mu_);
  // The file (job, path) for a reader of the version recorded as `tag`: the
  // node's own, else a replica brought for that version; null when neither
  // (a replica of another version is not it).
  const FileInfo* VersionFile(const std::string& job, const std::string& path, const std::string& tag) const
      REQUIRES(mu_);
  // PublicationHost::PinVersion (cache/publication.h).
  Status PinVersion(const std::string& session, const TagInfo& tag, size_t session_leases, size_t uid_leases,
                    VersionGrant* out, std::vector<uint64_t>* file_leases, uid_t* uid, uint64_t* charged)
      EXCLUDES(mu_);
  // The budget's side of the pool and of borrowers (BudgetSide; the steps
  // are in cache_memory.cc): pooled bytes fit in the budget beside every buffer;
  // the pool's filler waits for saves in flight (PersistSource's rule too).
  bool ReservePool(uint64_t bytes) EXCLUDES(mu_);
  void ReturnPool(uint64_t bytes) EXCLUDES(mu_);
  std::chrono::milliseconds WaitForNoSaves(std::chrono::milliseconds max) EXCLUDES(mu_);
  bool Borrow(uint64_t bytes) EXCLUDES(mu_);
  void GiveBack(uint64_t bytes) EXCLUDES(mu_);
  class BudgetSide : public PoolBudget, public MemoryBudget {
   public:
    explicit BudgetSide(Cache* cache) : c_(cache) {}
    bool ReservePool(uint64_t bytes) override { return c_->ReservePool(bytes); }
    void ReturnPool(uint64_t bytes) override { c_->ReturnPool(bytes); }
    std::chrono::milliseconds WaitForNoSaves(std::chrono::milliseconds max) override {
      return c_->WaitForNoSaves(max);
    }
    bool Borrow(uint64_t bytes) override { return c_->Borrow(bytes); }
    void GiveBack(uint64_t bytes) override { c_->GiveBack(bytes); }

   private:
    Cache* const c_;
  };
  std::unique_ptr<PublicationHost> MakePublicationSide();
  std::unique_ptr<StorageAccessHost> MakeStorageSide();
  std::unique_ptr<ReplicaHost> MakeReplicaSide();
  std::unique_ptr<PersistHost> MakePersistSide();
  std::unique_ptr<BackupHost> MakeBackupSide();
  std::unique_ptr<RingsHost> MakeRingsSide();
  // BackupHost's steps (cache_ring.cc), each under mu_.
  bool PinForBackup(const FileKey& key, BackupJob* out) EXCLUDES(mu_);
  void RecordBackup(const BackupJob& job, const Status& result) EXCLUDES(mu_);
  bool TagToSend(const TagCopy& copy, TagInfo* tag, std::string* peer, int32_t* node) EXCLUDES(mu_);
  size_t ForgetHolder(const std::string& job, const std::string& peer) EXCLUDES(mu_);
  // PersistHost's steps (cache_persistence.cc), each under mu_.
  bool PinCurrent(const FileKey& key, bool retry, PersistJob* out) EXCLUDES(mu_);
  bool IsCurrentVersion(const PersistJob& job) EXCLUDES(mu_);
  void RecordPersisted(const PersistJob& job, const Status& result, std::vector<Record> records,
                       const FileStat& written) EXCLUDES(mu_);
  void EndPersistence() EXCLUDES(mu_);
  // RecoveryHost's steps (cache_recovery.cc), each under mu_ (CheckRecovered
  // and ProbePath ask storage, without it). A reserved buffer is also the
  // storage access's and the replicas' (their hosts' ReserveBuffer).
  std::unique_ptr<RecoveryHost> MakeRecoverySide();
  Status ReserveRecovery(uint64_t size, std::unique_ptr<Buffer>* out) EXCLUDES(mu_);
  void AbandonRecovery(std::unique_ptr<Buffer> mem) EXCLUDES(mu_);
  Status AdoptRecovered(FileInfo f, std::unique_ptr<Buffer> mem, const StorageCheck& storage,
                        const DiskIdentity& here) EXCLUDES(mu_);
  size_t AdoptTags(const std::string& job, std::vector<TagInfo> tags) EXCLUDES(mu_);
  std::vector<size_t> TagFilesNotHeld(const TagInfo& tag) EXCLUDES(mu_);
  bool ProbePath(const std::string& path, Status* status, DiskIdentity* now);
  std::vector<FileInfo> NotInMemory(const std::string& job) EXCLUDES(mu_);
  size_t InMemoryCount(const std::string& job) EXCLUDES(mu_);
  Status StartPeerRead(const std::string& job, const std::string& path, FileInfo* out, int* fd) EXCLUDES(mu_);
  void EndPeerRead(uint64_t buffer_id) EXCLUDES(mu_);
  // Forgets a complete tag (its files were deleted from storage): neither
  // listed nor published any more, here or, once recorded, after a restart.
  void ForgetTag(const std::string& job, const std::string& tag) EXCLUDES(mu_);
  // Tags (cache_tags.cc). Forgets the job's oldest other tags while it would hold more than
  // max_tags_per_job, or while `tag`'s record does not fit its owner's share
  // of metadata_budget; RESOURCE_EXHAUSTED when it cannot fit at all.
  Status MakeRoomForTag(const TagInfo& tag) REQUIRES(mu_);
  // Forgets the job's oldest tags beyond max_tags_per_job.
  void TrimTags(const std::string& job) REQUIRES(mu_);
  // Forgets a tag (neither listed nor published, here or after a restart).
  void DropTag(const std::string& job, const std::string& tag, const std::string& why) REQUIRES(mu_);
  // A tag adopted from elsewhere replaced `before` (null: none): counted.
  void CountTag(const TagInfo* before, const std::string& job, const std::string& tag) REQUIRES(mu_);
  // What MetadataQuota counts for the job's tags now.
  uint64_t JobTagBytes(const std::string& job) const REQUIRES(mu_);
  // The uid MetadataQuota counts a job's tags against (0 when none owns it).
  uid_t TagOwner(const std::string& job) const REQUIRES(mu_);
  // JobOwners::Restore, counting a job new here against MetadataQuota.
  void RestoreOwner(const std::string& job, uid_t uid, gid_t gid = JobOwners::kNoGid) REQUIRES(mu_);
  // One wait of a blocked call on `cv` until `deadline`: false once the
  // deadline passed. With `gone`, it wakes at least every kCallerGonePoll
  // and *status is CANCELLED when the caller went away.
  bool BlockedWait(CondVar* cv, Clock::TimePoint deadline, const CallerGone& gone, Status* status)
      REQUIRES(mu_);
  // Whether `f` is the file `tag` published as `tf`: the same commit when
  // the publication saw it here (or the replica brought for it), else one
  // committed before it, of the same size.
  bool IsVersionsFile(const TagInfo& tag, const TagFile& tf, const FileInfo& f) const REQUIRES(mu_);
  Status FindAllocation(const std::string& session, uint64_t id,
                        std::map<uint64_t, Allocation>::iterator* it) REQUIRES(mu_);
  void RecordFate(uint64_t id, Fate fate) REQUIRES(mu_);
  // The buffer of a replaced/removed/aborted file goes back to the pool (or
  // drains while leased).
  void ReleaseBuffer(uint64_t buffer_id) REQUIRES(mu_);
  // After a lease or pin ends: a DRAINING buffer nobody uses is FREE again.
  void MaybeFree(Buf& buf) REQUIRES(mu_);
  // The best FREE buffer for a `size`-byte file of this session, or null.
  Buf* PickFree(const std::string& session, uint64_t size) REQUIRES(mu_);
  // Evicts the least recently committed PERSISTED file nobody reads; false if none.
  bool EvictOne() REQUIRES(mu_);
  bool Evictable(const FileInfo& f) REQUIRES(mu_);
  void Evict(FileInfo& f, const char* why) REQUIRES(mu_);
  void EnforceKeepLast(const std::string& job) REQUIRES(mu_);
  void Note(const FileInfo& f, bool removed) REQUIRES(mu_);
  // Makes room for `need` more bytes; appends ids this session must unmap.
  // `passes`: 1 destroys only free buffers nobody maps; 2 also the ones only
  // this session maps; 3 also retires the ones other sessions map.
  void Reclaim(const std::string& session, uint64_t need, std::vector<uint64_t>* unmap,
               int passes = 3) REQUIRES(mu_);
  // Every byte counted against the budget, the pool's aside.
  uint64_t Held() const REQUIRES(mu_) { return used_ + reserved_ + lent_; }
  // Sheds what the pool holds beyond the budget (the budget holds buffers first).
  void ShedPool() EXCLUDES(mu_);
  void DropMapper(Buf& buf, const std::string& session) REQUIRES(mu_);  // may erase buf
  // The buffer goes (destroyed or retired): its keep_mapped readers are
  // told to unmap it.
  void DropReaders(Buf& buf) REQUIRES(mu_);
  void OweUnmaps(const std::set<std::string>& sessions, uint64_t buffer_id) REQUIRES(mu_);
  std::string FullMessage(uint64_t need) const REQUIRES(mu_);
  CacheStats TallyLocked() const REQUIRES(mu_);
  // The files by state and persistence by root (CacheStats::roots), in
  // one pass over the file table; `persisted`: persistence_'s figures.
  void TallyFiles(const PersistFigures& persisted, CacheStats* s) const REQUIRES(mu_);
  void StartAllocation(const AllocateRequest& req, const DiskIdentity& disk, Buf& buf,
                       AllocateResult* out) REQUIRES(mu_);
  // A new buffer of `capacity` bytes (already counted in reserved_): from
  // the pool, else made now; the pool sheds what no longer fits the budget.
  Status NewBuffer(uint64_t id, uint64_t capacity, std::unique_ptr<Buffer>* out) EXCLUDES(mu_);
  // ---- coherence with storage (cache/storage_check.h); no lock held ----
  // What the path of a save in `session` holds now: NOT_FOUND /
  // PERMISSION_DENIED / FAILED_PRECONDITION when torch.save would fail there
  // (under an object root: another uid's object is there); unknown (the
  // save goes on unchecked) when storage does not answer.
  Status SnapshotFor(const std::string& session, const std::string& path, DiskIdentity* out) EXCLUDES(mu_);
  // A ring copy's storage identity against storage now (filesystem calls,
  // through the prober; no lock); *here: what the path holds now. kElsewhere
  // when there is nothing to compare (no identity, another disk).
  StorageCheck CheckRecovered(const FileInfo& f, DiskIdentity* here);
  // Refuses a ring copy that storage has moved past (or that would be
  // written over a file it does not record: `what` says which), and
  // records the file as storage's (EVICTED with the reason). FAILED_PRECONDITION.
  Status RefuseStaleCopy(const FileKey& key, const FileInfo& copy, const std::string& why,
                         const std::string& what = "is older than storage") REQUIRES(mu_);
  // Compares a file with memory with storage and applies the verdict: a
  // persisted file that changed there loses its copy (EVICTED), an
  // unpersisted one is DISCARDED; storage unavailable: counted and logged.
  void Revalidate(const FileKey& key);
  // Object roots (cache_objects.cc): what the key holds now, as a save's
  // snapshot or compared with `expected`.
  // What the key holds, asked on the prober (bounded by the storage check
  // timeout: UNAVAILABLE past it).
  Status ProbeObject(const ObjectRoot& root, const std::string& key, ObjectId* out);
  Status SnapshotObject(const ObjectRoot& root, const std::string& key, const std::string& path,
                        const Requester& who, DiskIdentity* out);
  // Whom an object call is for (storage/object_owner.h): the session's
  // uid, `uid`, or the owner of `job` (none: a requester no object's owner
  // is); an administrator when that is root and root_is_admin.
  Status SessionRequester(const std::string& session, Requester* out) EXCLUDES(mu_);
  Requester RequesterOf(uid_t uid) EXCLUDES(mu_);
  Requester JobRequester(const std::string& job) EXCLUDES(mu_);
  StorageCheck CheckObject(const ObjectRoot& root, const std::string& key, const DiskIdentity& expected);
  // A tag's completeness marker (`.metadata`, `latest`) under an object
  // root waits while another file of its tag is not yet on storage: one of
  // this node's (LocalTagFilesPending), or, on a job whose ring has other
  // nodes, until its tag is recorded and the other nodes report theirs
  // durable (PeersMustConfirm; `remote` gets those files);
  // ReleaseMarkers queues the waiting markers of `job` that may go now.
  bool MarkerMustWait(const FileKey& key, const FileInfo& f) const REQUIRES(mu_);
  // Whom the server reads storage as for `job` when no client of it asks
  // (the ring's reads, prefetches; a recovered file's owner): the job's
  // owner (JobOwners), whoever set its ring. NOT_FOUND when no client set
  // the job's ring here; PERMISSION_DENIED when the owner's group is unknown.
  Status JobOwnerIds(const std::string& job, uid_t* uid, gid_t* gid) EXCLUDES(mu_);
  Status JobOwnerIdsLocked(const std::string& job, uid_t* uid, gid_t* gid) const REQUIRES(mu_);
  Status InstallFetched(const std::string& job, const std::string& path, std::unique_ptr<Buffer> mem,
                        uint64_t size, uid_t uid, gid_t gid, DiskIdentity disk, const std::string& from,
                        double secs) EXCLUDES(mu_);
  bool LocalTagFilesPending(const FileKey& key, const FileInfo& f) const REQUIRES(mu_);
  bool PeersMustConfirm(const FileKey& key, const FileInfo& f, std::vector<std::string>* remote) const
      REQUIRES(mu_);
  void ReleaseMarkers(const std::string& job) REQUIRES(mu_);
  void NoteStorageFallback(const std::string& path, const std::string& why);  // thread-safe
  DiskIdentity Written(const DiskIdentity& before, const FileStat& st);
  // Frees the file's memory and ring copy, with `state` and `why` recorded.
  void LetGo(FileInfo& f, FileState state, const std::string& why) REQUIRES(mu_);
  // Whether files are persisted (some storage root), or stay in memory.
  bool persistence_enabled() const { return !storage_->empty(); }
  // ClientStore::List and ListTags unchecked: every file, every tag.
  std::vector<FileInfo> List(const std::string& job, const std::string& tag) EXCLUDES(mu_);
  std::vector<TagInfo> ListTags(const std::string& job) EXCLUDES(mu_);
  // Restore's tags, after its files.
  void RestoreTags(std::vector<TagInfo> tags) REQUIRES(mu_);
  void Discard(FileInfo& f, const std::string& why) REQUIRES(mu_);
  void DropStale(FileInfo& f, const std::string& why) REQUIRES(mu_);

  const uint64_t budget_;
  MetaSink* const meta_;  // every state change is recorded there (null: nowhere)
  TagFeed* const tag_feed_;  // null: nobody is told of complete tags
  const std::chrono::milliseconds full_timeout_;
  const size_t keep_last_;
  Env* const env_;
  Clock* const clock_;
  const std::shared_ptr<const StorageRoots> storage_;  // never null (empty: memory only)
  std::set<FileKey> waiting_markers_ GUARDED_BY(mu_);
  std::map<FileKey, uint64_t> peers_durable_ GUARDED_BY(mu_);  // marker -> the version the ring confirmed
  Mutex mu_;
  CondVar done_cv_;     // a file was persisted or failed
  CondVar quiet_cv_;    // no allocation pending or starting any more
  bool stopping_ GUARDED_BY(mu_) = false;
  std::atomic<uint64_t> storage_fallbacks_{0};
  std::atomic<uint64_t> disk_seq_{0};
  const std::chrono::milliseconds check_timeout_;
  const std::unique_ptr<Prober> prober_;
  LogLimiter storage_log_{5, std::chrono::seconds(10)};
  uint64_t used_ GUARDED_BY(mu_) = 0;  // capacity of every buffer in buffers_
  uint64_t reserved_ GUARDED_BY(mu_) = 0;  // bytes of buffers being created
  uint64_t lent_ GUARDED_BY(mu_) = 0;      // bytes borrowed (MemoryBudget)
  int starting_ GUARDED_BY(mu_) = 0;       // allocations making their new buffer
  uint64_t pooled_ GUARDED_BY(mu_) = 0;    // bytes the pool holds or is making
  const Backing backing_;
  std::atomic<uint64_t> hugetlb_fallbacks_{0};
  LogLimiter fallback_log_{1, std::chrono::seconds(60)};
  uint64_t next_buffer_id_ GUARDED_BY(mu_) = 1;
  uint64_t next_allocation_id_ GUARDED_BY(mu_) = 1;
  std::map<uint64_t, Buf> buffers_ GUARDED_BY(mu_);
  std::map<uint64_t, Allocation> pending_ GUARDED_BY(mu_);
  std::unordered_map<uint64_t, Fate> fates_ GUARDED_BY(mu_);
  std::deque<uint64_t> fate_order_ GUARDED_BY(mu_);
  std::map<FileKey, FileInfo> files_ GUARDED_BY(mu_);
  CacheCounters counts_ GUARDED_BY(mu_);  // what Stats() reports as done since start
  class SessionSide;  // Sessions' host (cache_sessions.cc), as for the Publication below
  const std::unique_ptr<SessionHost> session_side_;
  Sessions sessions_;  // sessions and their leases; its own lock, taken inside mu_ (or alone)
  JobOwners owners_ GUARDED_BY(mu_);
  MetadataQuota quota_ GUARDED_BY(mu_);  // tags, job names, grants, version leases
  // (job, tag) -> the version of each of its files held here when it was
  // published: a file saved again since is not that version's any more.
  std::map<std::pair<std::string, std::string>, std::map<std::string, uint64_t>> published_ GUARDED_BY(mu_);
  // Files of followed versions brought from other nodes: never persisted,
  // backed up or recorded; read under version leases; evicted once unleased.
  std::map<FileKey, FileInfo> replica_files_ GUARDED_BY(mu_);
  // Buffers lent out for a replica (ReplicaHost::LendBuffer) -> the sessions that
  // keep them mapped, given back to the buffer when it is adopted.
  std::map<uint64_t, std::set<std::string>> lent_readers_ GUARDED_BY(mu_);
  LogLimiter refused_log_{5, std::chrono::seconds(10)};  // refusals by JobOwners (thread-safe)
  TagRegistry tags_;  // its own lock, taken inside mu_ (or alone)
  class RingsSide;  // Rings' host, as BackupSide below (cache_rings.cc)
  const std::unique_ptr<RingsHost> rings_side_;
  Rings rings_;  // its own lock, taken inside mu_ (or alone)
  const std::shared_ptr<RestoreTracker> restores_;  // its own lock, taken inside mu_ (or alone)
  bool accepting_ GUARDED_BY(mu_) = true;
  // Marks the file FAILED with `why`, and schedules another attempt if `why` may clear.
  void FailPersist(FileInfo& f, const Status& why) REQUIRES(mu_);
  // Makes a FAILED file (with memory) CACHED/BACKED_UP again.
  void Reopen(FileInfo& f) REQUIRES(mu_);
  // Reopen, and queue it for persistence now.
  void Requeue(FileInfo& f) REQUIRES(mu_);
  void QueuePersist(const FileKey& key) REQUIRES(mu_);
  bool JobUidLocked(const std::string& job, uid_t* uid) const REQUIRES(mu_);  // JobUid
  // Whether a committed file in memory is still to be persisted (not FAILED).
  bool AwaitingPersistence() const REQUIRES(mu_);
  void QueueBackup(const FileKey& key) REQUIRES(mu_);
  // Every complete tag of `job` recorded here, to the job's successor.
  void QueueTags(const std::string& job) REQUIRES(mu_);
  // RingsHost::JoinRing (cache_rings.cc); returns the successor ("" for one node).
  std::string JoinRing(const JoinedRing& ring) EXCLUDES(mu_);
  void QueueDrop(const FileInfo& f) REQUIRES(mu_);
  // The publication asks the Cache through PublicationSide
  // (cache_versions.cc), which holds no state of its own.
  class PublicationSide;
  const std::unique_ptr<PublicationHost> publication_side_;
  const std::unique_ptr<Publication> publication_;  // the TagRegistry and PublicationSide outlive it
  class StorageSide;  // the same for StorageAccess (cache_fetch.cc)
  const std::unique_ptr<StorageAccessHost> storage_side_;
  const std::unique_ptr<StorageAccess> storage_access_;
  class ReplicaSide;  // the same for Replicas (cache_follow.cc)
  const std::unique_ptr<ReplicaHost> replica_side_;
  const std::unique_ptr<Replicas> replicas_;
  class PersistSide;  // the same for Persistence (cache_persistence.cc)
  const std::unique_ptr<PersistHost> persist_side_;
  const std::unique_ptr<Persistence> persistence_;
  class BackupSide;  // the same for Backups (cache_ring.cc)
  const std::unique_ptr<BackupHost> backup_side_;
  const std::unique_ptr<Backups> backups_;
  class RecoverySide;  // the same for Recovery (cache_recovery.cc)
  const std::unique_ptr<RecoveryHost> recovery_side_;
  const std::unique_ptr<Recovery> recovery_;
  // Last: destroyed first, while the budget it gives its bytes back to is whole.
  // The pool's PoolBudget and the borrowers' MemoryBudget; made before the
  // pool, which it outlives.
  BudgetSide budget_side_{this};
  std::unique_ptr<BufferPool> pool_;
};

}  // namespace tce
