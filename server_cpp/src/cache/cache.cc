// Cache: files. Allocate, commit, abort, look up, remove and list files;
// the state as a whole (stats, restore, metadata). Sessions, memory,
// tags, storage coherence, persistence and the ring are in cache_*.cc.
#include "cache/cache.h"

#include "cache/storage_check.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <tuple>

#include "common/clock.h"
#include "common/log_limiter.h"
#include "common/logging.h"
#include "common/strings.h"

namespace tce {
namespace {

constexpr size_t kFatesKept = 65536;

PublicationOptions PublicationOf(const SessionLimits& limits) {
  PublicationOptions o;
  o.version_lease = limits.version_lease;
  o.version_lease_max = limits.version_lease_max;
  o.read_grants = limits.read_grants;
  o.max_grants_per_job = limits.metadata.max_grants_per_job;
  return o;
}

}  // namespace

void Cache::Note(const FileInfo& f, bool removed) {
  if (meta_) meta_->Record(f, removed);
}

void Cache::Restore(std::vector<FileInfo> files, std::vector<TagInfo> tags) {
  MutexLock lock(&mu_);
  for (FileInfo& f : files) {
    if (f.state == FileState::kPersisted || f.state == FileState::kEvicted) {
      f.state = FileState::kEvicted;  // on storage; the memory did not survive
    } else if (f.state == FileState::kDiscarded) {
      // stays discarded, with its reason
    } else if (f.state != FileState::kFailed || f.reason.empty()) {
      f.state = FileState::kFailed;
      f.reason = "lost: the server restarted before the file was persisted";
    }
    f.buffer_id = 0;
    f.capacity = 0;
    next_allocation_id_ = std::max(next_allocation_id_, f.version + 1);
    RestoreOwner(f.job, f.owner_uid, f.owner_gid);
    Note(f, false);
    files_[{f.job, f.path}] = std::move(f);
  }
  TCE_LOG(kInfo, "cache") << "re-indexed " << files_.size() << " file(s) from metadata";
  RestoreTags(std::move(tags));  // after the files, which tell the jobs' owners
}

Cache::Cache(CacheOptions options)
    : budget_(options.budget_bytes),
      meta_(options.meta),
      tag_feed_(options.tag_feed),
      full_timeout_(options.full_timeout),
      keep_last_(options.keep_last),
      env_(options.env),
      clock_(options.clock),
      storage_(options.storage ? std::move(options.storage) : std::make_shared<const StorageRoots>()),
      check_timeout_(options.storage_check_timeout),
      prober_(std::make_unique<Prober>(options.storage_check_timeout, options.clock)),
      backing_(options.backing),
      session_side_(MakeSessionSide()),
      sessions_(options.limits, session_side_.get(), options.clock),
      rings_side_(MakeRingsSide()),
      rings_(options.meta, rings_side_.get()),
      restores_(options.restores ? std::move(options.restores)
                                 : std::make_shared<RestoreTracker>(options.clock, options.restore_wait)),
      publication_side_(MakePublicationSide()),
      publication_(std::make_unique<Publication>(PublicationOf(options.limits), options.clock, &tags_,
                                                 publication_side_.get())),
      storage_side_(MakeStorageSide()),
      storage_access_(std::make_unique<StorageAccess>(storage_, StorageAccessOptions{options.fetch_files},
                                                      options.clock, storage_side_.get())),
      replica_side_(MakeReplicaSide()),
      replicas_(std::make_unique<Replicas>(&tags_, replica_side_.get())),
      persist_side_(MakePersistSide()),
      persistence_(std::make_unique<Persistence>(options.persist_feed, storage_.get(), persist_side_.get())),
      backup_side_(MakeBackupSide()),
      backups_(std::make_unique<Backups>(options.backup_feed, backup_side_.get(), options.clock)),
      recovery_side_(MakeRecoverySide()),
      recovery_(std::make_unique<Recovery>(storage_.get(), recovery_side_.get())) {
  const SessionLimits& limits = options.limits;
  MutexLock lock(&mu_);
  owners_.set_root_is_admin(limits.root_is_admin);
  owners_.set_max_jobs_per_uid(limits.metadata.max_jobs_per_uid);
  quota_.SetLimits(limits.metadata);
  lock.Unlock();
  if (options.prealloc > 0) pool_ = std::make_unique<BufferPool>(options.prealloc, backing_, &budget_side_);
}

void Cache::RecordFate(uint64_t id, Fate fate) {
  fates_[id] = fate;
  fate_order_.push_back(id);
  if (fate_order_.size() > kFatesKept) {
    fates_.erase(fate_order_.front());
    fate_order_.pop_front();
  }
}

CacheStats Cache::TallyLocked() const {
  CacheStats s;
  s.budget = budget_;
  s.used = Held();
  for (const auto& [id, b] : buffers_) {
    switch (b.state) {
      case BufState::kFree: s.free += b.capacity; break;
      case BufState::kPending: s.pending += b.capacity; break;
      case BufState::kCached:
      case BufState::kDraining: s.cached += b.capacity; break;
      case BufState::kRetiring: s.retiring += b.capacity; break;
    }
  }
  s.buffers = buffers_.size();
  s.files = files_.size();
  s.sessions = sessions_.size();
  s.leases = sessions_.leases();
  s.version_leases = publication_->leases();
  s.metadata_bytes = quota_.used();
  s.metadata_budget = quota_.limits().budget;
  s.replica_files = replica_files_.size();
  s.version_ranges_served = replicas_->ranges_served();
  s.versions_published = counts_.versions_published;
  s.objects_fetched = counts_.fetched_objects;
  s.object_bytes_fetched = counts_.fetched_bytes;
  s.object_ranges_read = storage_access_->ranges_read();
  s.held_markers = waiting_markers_.size();
  s.marker_rounds = counts_.marker_rounds;
  s.object_fetches_shared = storage_access_->fetches_shared();
  for (const ObjectRoot& r : storage_->objects().all()) {
    s.object_roots.push_back(r.dir + "=" + r.url);
    s.object_retries += r.store->retries();
  }
  s.buffers_created = counts_.buffers_created;
  s.buffers_reused = counts_.buffers_reused;
  s.persist_queue = persistence_->Backlog();
  const BackupFigures backups = backups_->Figures();
  const std::vector<FileKey> waiting = backups_->Waiting();
  s.backup_queue = waiting.size() + backups.in_flight;
  for (const FileKey& key : waiting) {
    auto it = files_.find(key);
    if (it != files_.end()) s.backup_lag_bytes += it->second.size;
  }
  s.backed_up_files = backups.backed_up_files;
  s.backup_failures = backups.failures;
  s.backup_failing = backups.failing;
  const RecoveryFigures recovered = recovery_->Figures();
  s.recovered_files = recovered.recovered_files;
  s.ring_checksum_mismatches = recovered.mismatches;
  s.backup_error = backups.error;
  const PersistFigures persisted = persistence_->Figures();
  s.persisted_files = persisted.files;
  s.persisted_bytes = persisted.bytes;
  TallyFiles(persisted, &s);
  s.evicted_files = counts_.evicted_files;
  s.discarded_files = counts_.discarded_files;
  s.stale_drops = counts_.stale_drops;
  s.storage_fallbacks = storage_fallbacks_;
  s.accepting = accepting_;
  s.memory_backing = BackingName(backing_);
  for (const auto& [id, b] : buffers_)
    if (b.mem && b.mem->backing() != Backing::k4k) ++s.huge_page_buffers;
  s.hugetlb_fallbacks = hugetlb_fallbacks_;
  return s;
}

void Cache::TallyFiles(const PersistFigures& persisted, CacheStats* s) const {
  std::map<std::string, size_t> at;  // root -> its index in s->roots
  for (const std::string& dir : storage_->dirs()) {
    at[dir] = s->roots.size();
    s->roots.push_back({dir, ""});
  }
  for (const ObjectRoot& r : storage_->objects().all()) {
    at[r.dir] = s->roots.size();
    s->roots.push_back({r.dir, r.url});
    s->roots.back().retries = r.store->retries();
  }
  auto of = [&](const std::string& path) -> CacheStats::RootStats* {
    if (at.empty()) return nullptr;  // memory only
    auto it = at.find(storage_->RootName(path));
    return it == at.end() ? nullptr : &s->roots[it->second];
  };
  for (const auto& [key, f] : files_) {
    s->failed_files += f.state == FileState::kFailed;
    const int n = static_cast<int>(f.state);
    if (n > 0 && n < kFileStateSlots) ++s->files_by_state[n];
    CacheStats::RootStats* r = of(key.second);
    if (!r) continue;
    if (f.state == FileState::kFailed) ++r->failed_files;
    if (f.buffer_id != 0 && (f.state == FileState::kCached || f.state == FileState::kBackedUp)) {
      ++r->queued_files;
      r->queued_bytes += f.size;
    }
  }
  for (const FileKey& key : waiting_markers_)
    if (CacheStats::RootStats* r = of(key.second)) ++r->held_markers;
  for (const auto& [root, written] : persisted.by_root) {
    auto it = at.find(root);
    if (it == at.end()) continue;
    s->roots[it->second].written_files = written.first;
    s->roots[it->second].written_bytes = written.second;
  }
}

void Cache::StartAllocation(const AllocateRequest& req, const DiskIdentity& disk, Buf& buf,
                            AllocateResult* out) {
  Allocation a;
  a.id = next_allocation_id_++;
  a.session = req.session;
  a.buffer_id = buf.id;
  a.file.job = req.job;
  a.file.tag = req.tag;
  a.file.path = req.path;
  a.file.rank = req.rank;
  a.file.size = req.size;
  a.file.state = FileState::kPending;
  a.file.buffer_id = buf.id;
  a.file.capacity = buf.capacity;
  a.file.created_unix_ns = clock_->UnixNowNs();
  const SessionTable::Session* who = sessions_.Find(req.session);
  a.file.owner_uid = who->uid;
  a.file.owner_gid = who->gid;
  a.file.new_mode = req.mode & 0777;
  a.file.disk = disk;
  buf.state = BufState::kPending;
  buf.allocation_id = a.id;
  buf.uid = a.file.owner_uid;
  out->allocation_id = a.id;
  out->buffer_id = buf.id;
  out->capacity = buf.capacity;
  pending_.emplace(a.id, std::move(a));
}

Status Cache::Allocate(const AllocateRequest& req, AllocateResult* out) {
  Status s = ValidateName("job", req.job, /*allow_empty=*/false, /*allow_slash=*/true);
  if (s.ok()) s = ValidateName("tag", req.tag, /*allow_empty=*/true, /*allow_slash=*/false);
  if (s.ok()) s = ValidatePath(req.path);
  if (s.ok() && req.size == 0) s = Status::InvalidArgument("size must be > 0");
  if (s.ok()) s = storage_->CheckUnder(req.path);
  DiskIdentity disk;
  if (s.ok()) s = SnapshotFor(req.session, req.path, &disk);
  if (s.ok() && req.size > budget_)
    s = Status::ResourceExhausted("file of " + std::to_string(req.size) + " bytes (" +
                                  HumanBytes(req.size) + ") exceeds the cache budget of " +
                                  std::to_string(budget_) + " bytes (" + HumanBytes(budget_) + ")");
  MutexLock lock(&mu_);
  if (s.ok()) s = CheckAccess(req.session, req.job, "write " + req.path + " in job '" + req.job + "'",
                              /*claim=*/true);
  if (s.ok() && !accepting_) s = Status::Unavailable("the server is shutting down: it takes no new saves");
  if (!s.ok()) {
    TCE_LOG(kWarning, "cache") << "refused allocate job=" << req.job << " path=" << req.path
                               << " size=" << req.size << ": " << s.ToString();
    return s;
  }
  sessions_.TakeUnmaps(req.session, &out->unmap_buffer_ids);

  const uint64_t capacity =
      RoundForBacking(std::min(Buffer::CapacityFor(req.size), std::max(req.size, budget_)), backing_);
  const auto deadline = clock_->Now() + full_timeout_;
  while (true) {
    // 1. A free buffer that fits, never one another live session has mapped;
    //    ours first (no mmap, no fd passing), then the smallest.
    if (Buf* best = PickFree(req.session, req.size)) {
      ++counts_.buffers_reused;
      StartAllocation(req, disk, *best, out);
      TCE_LOG(kInfo, "cache") << "allocated job=" << req.job << " tag=" << req.tag
                              << " path=" << req.path << " size=" << req.size
                              << " buffer=" << best->id << " (reused)";
      return Status::OK();
    }
    // 2. Room for a new buffer, after reclaiming free ones if need be.
    if (Held() + capacity > budget_) Reclaim(req.session, capacity, &out->unmap_buffer_ids);
    if (Held() + capacity <= budget_) break;
    // 3. Evict the least recently committed persisted file, and look again.
    if (EvictOne()) continue;
    // 4. Only unpersisted files hold the memory: wait for persistence to
    //    finish some (never evict what is not on storage), within bounds.
    if (persistence_enabled() && (persistence_->Busy() || AwaitingPersistence()) &&
        !stopping_ && clock_->WaitUntil(&done_cv_, &mu_, deadline)) {
      if (!sessions_.Find(req.session)) return sessions_.Check(req.session);
      continue;
    }
    Status full = Status::ResourceExhausted(FullMessage(capacity));
    TCE_LOG(kWarning, "cache") << "refused allocate job=" << req.job << " path=" << req.path
                               << ": " << full.message();
    return full;
  }
  const uint64_t id = next_buffer_id_++;
  reserved_ += capacity;
  ++starting_;  // a save from here on (WaitForNoSaves): the pool's refill waits
  lock.Unlock();
  std::unique_ptr<Buffer> mem;
  s = NewBuffer(id, capacity, &mem);
  lock.Lock();
  reserved_ -= capacity;
  --starting_;
  // (On success the allocation is pending before the lock is released.)
  if (starting_ == 0 && pending_.empty()) quiet_cv_.SignalAll();
  if (!s.ok()) {
    TCE_LOG(kError, "cache") << "cannot create buffer of " << capacity << " bytes: " << s.ToString();
    return s;
  }
  if (!sessions_.Find(req.session)) return sessions_.Check(req.session);  // closed meanwhile
  Buf& buf = Install(std::move(mem));
  StartAllocation(req, disk, buf, out);
  TCE_LOG(kInfo, "cache") << "allocated job=" << req.job << " tag=" << req.tag
                          << " path=" << req.path << " size=" << req.size << " buffer=" << id
                          << " capacity=" << capacity << " (new)";
  return Status::OK();
}

Status Cache::FindAllocation(const std::string& session, uint64_t id,
                             std::map<uint64_t, Allocation>::iterator* it) {
  Status s = sessions_.Check(session);
  if (!s.ok()) return s;
  *it = pending_.find(id);
  if (*it != pending_.end()) {
    if ((*it)->second.session != session)
      return Status::PermissionDenied("allocation " + std::to_string(id) +
                                      " belongs to another session");
    return Status::OK();
  }
  auto fate = fates_.find(id);
  if (fate == fates_.end()) return Status::NotFound("unknown allocation " + std::to_string(id));
  return Status::FailedPrecondition(
      "allocation " + std::to_string(id) +
      (fate->second == Fate::kCommitted ? " was already committed" : " was aborted"));
}

Status Cache::Commit(const std::string& session, uint64_t allocation_id,
                     std::vector<Record> records, FileInfo* out, bool zip_crc32) {
  MutexLock lock(&mu_);
  std::map<uint64_t, Allocation>::iterator it;
  Status s = FindAllocation(session, allocation_id, &it);
  if (s.ok()) {
    const uint64_t size = it->second.file.size;
    uint64_t end = 0;
    for (size_t i = 0; i < records.size() && s.ok(); ++i) {
      const Record& r = records[i];
      std::string where = "record " + std::to_string(i) + " '" + r.name + "'";
      if (r.name.empty()) s = Status::InvalidArgument("record " + std::to_string(i) + " has no name");
      else if (r.header_offset >= r.data_offset)
        s = Status::InvalidArgument(where + ": header_offset must be < data_offset");
      else if (r.data_offset > size || r.size > size - r.data_offset)
        s = Status::InvalidArgument(where + " ends past the file's " + std::to_string(size) + " bytes");
      else if (r.header_offset < end)
        s = Status::InvalidArgument(where + " overlaps the previous record or is out of order");
      else end = r.data_offset + r.size;
    }
  }
  if (!s.ok()) {
    TCE_LOG(kWarning, "cache") << "refused commit allocation=" << allocation_id << ": "
                               << s.ToString();
    return s;
  }
  Allocation a = std::move(it->second);
  pending_.erase(it);
  if (pending_.empty()) quiet_cv_.SignalAll();
  RecordFate(allocation_id, Fate::kCommitted);
  a.file.state = FileState::kCached;
  a.file.committed_unix_ns = clock_->UnixNowNs();
  a.file.version = allocation_id;
  a.file.records = std::move(records);
  a.file.zip_crc32 = zip_crc32;
  buffers_[a.buffer_id].state = BufState::kCached;
  buffers_[a.buffer_id].allocation_id = 0;
  FileKey key{a.file.job, a.file.path};
  auto old = files_.find(key);
  if (old != files_.end()) {
    // An older version persisted after this save looked at storage: the
    // path now holds what this server wrote.
    if (old->second.disk.known && old->second.disk.seq > a.file.disk.seq && a.file.disk.known)
      a.file.disk = old->second.disk;
    if (old->second.state != FileState::kEvicted) ReleaseBuffer(old->second.buffer_id);
    old->second = a.file;
  } else {
    files_.emplace(key, a.file);
  }
  *out = a.file;
  Note(a.file, false);
  QueuePersist(key);
  QueueBackup(key);
  EnforceKeepLast(key.first);
  TCE_LOG(kInfo, "cache") << "committed job=" << a.file.job << " tag=" << a.file.tag
                          << " path=" << a.file.path << " size=" << a.file.size
                          << " buffer=" << a.buffer_id
                          << (old != files_.end() ? " (replaced)" : "");
  return Status::OK();
}

Status Cache::Abort(const std::string& session, uint64_t allocation_id) {
  MutexLock lock(&mu_);
  std::map<uint64_t, Allocation>::iterator it;
  Status s = FindAllocation(session, allocation_id, &it);
  if (!s.ok()) return s;
  uint64_t buffer_id = it->second.buffer_id;
  TCE_LOG(kInfo, "cache") << "aborted allocation=" << allocation_id
                          << " path=" << it->second.file.path;
  pending_.erase(it);
  if (pending_.empty()) quiet_cv_.SignalAll();
  RecordFate(allocation_id, Fate::kAborted);
  ReleaseBuffer(buffer_id);
  return Status::OK();
}

Status Cache::Lookup(const std::string& session, const std::string& job, const std::string& path,
                     bool lease, FileInfo* out, uint64_t* lease_id,
                     std::vector<uint64_t>* unmap_buffer_ids) {
  {
    MutexLock lock(&mu_);
    Status s = CheckAccess(session, job, "read " + path + " of job '" + job + "'");
    if (!s.ok()) return s;
  }
  Revalidate({job, path});
  MutexLock lock(&mu_);
  Status s = CheckAccess(session, job, "read " + path + " of job '" + job + "'");
  if (!s.ok()) return s;
  if (lease) {
    s = sessions_.CanLease(session);
    if (!s.ok()) return s;
  }
  sessions_.TakeUnmaps(session, unmap_buffer_ids);
  auto it = files_.find({job, path});
  if (it == files_.end()) return Status::NotFound(path + " is not cached for job " + job);
  if (it->second.state == FileState::kEvicted)
    return Status::NotFound(path + " was evicted from the cache (it is on storage)");
  if (it->second.buffer_id == 0)  // re-indexed after a restart: the memory is gone
    return Status::NotFound(path + " is not in memory: " + it->second.reason);
  *out = it->second;
  *lease_id = 0;
  if (lease) {
    *lease_id = sessions_.AddLease(session, it->second.buffer_id);
    ++buffers_[it->second.buffer_id].leases;
  }
  return Status::OK();
}

Status Cache::Remove(const std::string& session, const std::string& job, const std::string& path,
                     FileInfo* out) {
  MutexLock lock(&mu_);
  Status s = CheckAccess(session, job, "remove " + path + " of job '" + job + "'");
  if (!s.ok()) return s;
  auto it = files_.find({job, path});
  if (it == files_.end()) return Status::NotFound(path + " is not cached for job " + job);
  *out = it->second;
  if (it->second.state != FileState::kEvicted) {
    ReleaseBuffer(it->second.buffer_id);
    QueueDrop(it->second);
  }
  Note(it->second, true);
  files_.erase(it);
  TCE_LOG(kInfo, "cache") << "removed job=" << job << " path=" << path;
  return Status::OK();
}

Status Cache::List(const std::string& session, const std::string& job, const std::string& tag,
                   std::vector<FileInfo>* out, bool check_storage) {
  if (check_storage) {
    std::vector<FileInfo> visible;
    Status s = List(session, job, tag, &visible, /*check_storage=*/false);
    if (!s.ok()) return s;
    for (const FileInfo& f : visible)
      if (f.buffer_id != 0) Revalidate({f.job, f.path});
  }
  std::vector<FileInfo> all = List(job, tag);
  MutexLock lock(&mu_);
  Status s = sessions_.Check(session);
  if (!s.ok()) return s;
  const uid_t uid = sessions_.Find(session)->uid;
  out->clear();
  for (FileInfo& f : all)
    if (owners_.Visible(uid, f.job)) out->push_back(std::move(f));
  return Status::OK();
}

std::vector<FileInfo> Cache::List(const std::string& job, const std::string& tag) {
  MutexLock lock(&mu_);
  std::vector<FileInfo> out;
  auto want = [&](const FileInfo& f) {
    return (job.empty() || f.job == job) && (tag.empty() || f.tag == tag);
  };
  for (const auto& [key, f] : files_)
    if (want(f)) out.push_back(f);
  for (const auto& [id, a] : pending_)
    if (want(a.file)) out.push_back(a.file);
  std::sort(out.begin(), out.end(), [](const FileInfo& a, const FileInfo& b) {
    return std::tie(a.job, a.tag, a.path, a.state) < std::tie(b.job, b.tag, b.path, b.state);
  });
  return out;
}

void Cache::StopAccepting() {
  MutexLock lock(&mu_);
  accepting_ = false;
}

std::vector<std::string> Cache::Unfinished(bool* allocations_in_flight) {
  MutexLock lock(&mu_);
  std::vector<std::string> out;
  *allocations_in_flight = !pending_.empty();
  for (const auto& [key, f] : files_) {
    if (f.state == FileState::kPending) continue;  // counted in pending_
    const bool persists = persistence_enabled() && (f.state == FileState::kCached || f.state == FileState::kBackedUp);
    // A file storage holds (persisted, or read from there) needs no copy
    // at the successor to survive.
    const bool backs_up = !rings_.Successor(key.first).empty() && f.backup_holder.empty() && f.buffer_id != 0 &&
                          f.state != FileState::kEvicted && f.state != FileState::kPersisted;
    if (persists || backs_up)
      out.push_back("job=" + key.first + " path=" + key.second + ":" + (persists ? " not persisted" : "") +
                    (backs_up ? " not backed up" : ""));
  }
  return out;
}

CacheStats Cache::Stats() {
  CacheStats s;
  {
    MutexLock lock(&mu_);
    s = TallyLocked();
  }
  if (pool_) s.pool = pool_->Stats();
  return s;
}

void Cache::RecordAll() {
  MutexLock lock(&mu_);
  if (!meta_) return;
  for (const auto& [key, f] : files_) meta_->Record(f, false);
  for (const TagInfo& t : tags_.All()) meta_->RecordTag(t);
  for (const RingInfo& r : rings_.Recorded()) meta_->RecordRing(r);
  TCE_LOG(kInfo, "cache") << "recorded " << files_.size() << " file(s) and " << tags_.size()
                          << " tag(s) again for a fresh metadata database";
}

}  // namespace tce
