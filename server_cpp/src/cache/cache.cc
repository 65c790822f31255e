#include "cache/cache.h"

#include "cache/storage_check.h"

#include <sys/random.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <tuple>

#include "common/log_limiter.h"
#include "common/logging.h"
#include "common/strings.h"

namespace tce {
namespace {

constexpr uint64_t kPage = 4096;
constexpr uint64_t kChunk = 64 << 10;
constexpr size_t kFatesKept = 65536;

uint64_t RoundUp(uint64_t v, uint64_t to) { return (v + to - 1) / to * to; }

int64_t NowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

std::string RandomSessionId() {
  unsigned char bytes[16];
  size_t got = 0;
  while (got < sizeof(bytes)) {
    ssize_t n = getrandom(bytes + got, sizeof(bytes) - got, 0);
    if (n > 0) got += static_cast<size_t>(n);
  }
  char hex[33];
  for (int i = 0; i < 16; ++i) snprintf(hex + 2 * i, 3, "%02x", bytes[i]);
  return std::string(hex, 32);
}

}  // namespace

void Cache::SetMetaSink(MetaSink* sink) {
  std::lock_guard<std::mutex> lock(mu_);
  meta_ = sink;
}

void Cache::Note(const FileInfo& f, bool removed) {
  if (meta_) meta_->Record(f, removed);
}

void Cache::Restore(std::vector<FileInfo> files) {
  std::lock_guard<std::mutex> lock(mu_);
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
    owners_.Restore(f.job, f.owner_uid);
    Note(f, false);
    files_[{f.job, f.path}] = std::move(f);
  }
  TCE_LOG(kInfo, "cache") << "re-indexed " << files_.size() << " file(s) from metadata";
}

Cache::Cache(uint64_t budget_bytes, std::vector<std::string> storage_roots, Env* env,
             std::chrono::milliseconds full_timeout, size_t keep_last)
    : budget_(budget_bytes), full_timeout_(full_timeout), keep_last_(keep_last), env_(env),
      prober_(std::make_unique<Prober>(check_timeout_)) {
  for (const std::string& root : storage_roots) {
    std::string resolved;
    roots_.push_back(env_->ResolvePath(root, &resolved).ok() ? resolved : root);
  }
}

Status Cache::CheckUnderRoots(const std::string& path) {
  if (roots_.empty()) return Status::OK();
  std::string resolved;
  Status s = env_->ResolvePath(path, &resolved);
  if (!s.ok()) return Status::PermissionDenied("cannot resolve " + path + ": " + s.message());
  for (const std::string& root : roots_) {
    if (root == "/" || resolved == root ||
        (resolved.size() > root.size() && resolved.compare(0, root.size(), root) == 0 &&
         resolved[root.size()] == '/'))
      return Status::OK();
  }
  std::string list;
  for (const std::string& root : roots_) list += (list.empty() ? "" : ", ") + root;
  return Status::PermissionDenied(path + (resolved != path ? " (resolves to " + resolved + ")" : "") +
                                  " is not under a storage root (" + list + ")");
}

uint64_t Cache::CapacityFor(uint64_t size) {
  if (size < kChunk) return RoundUp(size, kPage);
  return RoundUp(size + std::min<uint64_t>(size / 64, 64 << 20), kChunk);
}

bool Cache::Fits(uint64_t capacity, uint64_t size) {
  return size <= capacity && capacity <= size + size / 8 + (1 << 20);
}

std::string Cache::OpenSession(uid_t uid, pid_t pid, gid_t gid) {
  std::string id = RandomSessionId();
  std::lock_guard<std::mutex> lock(mu_);
  Session& session = sessions_[id];
  session.uid = uid;
  session.gid = gid;
  session.pid = pid;
  session.last_used = std::chrono::steady_clock::now();
  TCE_LOG(kInfo, "session") << "opened session=" << id.substr(0, 8) << " uid=" << uid
                            << " pid=" << pid;
  return id;
}

void Cache::CloseSession(const std::string& session) {
  std::lock_guard<std::mutex> lock(mu_);
  auto sit = sessions_.find(session);
  if (sit == sessions_.end()) return;
  size_t aborted = 0, dropped = 0;
  for (auto it = pending_.begin(); it != pending_.end();) {
    if (it->second.session == session) {
      uint64_t buffer_id = it->second.buffer_id;
      RecordFate(it->first, Fate::kAborted);
      it = pending_.erase(it);
      ReleaseBuffer(buffer_id);
      ++aborted;
    } else {
      ++it;
    }
  }
  for (auto it = leases_.begin(); it != leases_.end();) {
    if (it->second.session == session) {
      DropLease(it++);
      ++dropped;
    } else {
      ++it;
    }
  }
  std::vector<uint64_t> ids;
  for (auto& [id, buf] : buffers_) ids.push_back(id);
  for (uint64_t id : ids) {
    auto b = buffers_.find(id);
    if (b != buffers_.end()) DropMapper(b->second, session);
  }
  if (pending_.empty()) quiet_cv_.notify_all();
  TCE_LOG(kInfo, "session") << "closed session=" << session.substr(0, 8)
                            << " pid=" << sit->second.pid << " aborted=" << aborted
                            << " leases_dropped=" << dropped;
  sessions_.erase(sit);
}

Status Cache::CheckSession(const std::string& session) {
  auto it = sessions_.find(session);
  if (it != sessions_.end()) {
    it->second.last_used = std::chrono::steady_clock::now();
    return Status::OK();
  }
  return Status::Unauthenticated(
      "unknown session '" + session.substr(0, 32) +
      "': open a session on the server's fd socket (<socket>.fd) first");
}

Status Cache::CheckAccess(const std::string& session, const std::string& job,
                          const std::string& what, bool claim) {
  Status s = CheckSession(session);
  if (!s.ok()) return s;
  const uid_t uid = sessions_[session].uid;
  s = claim ? owners_.Claim(uid, job, what) : owners_.Check(uid, job, what);
  uint64_t dropped = 0;
  if (!s.ok() && refused_log_.Allow(&dropped))
    TCE_LOG(kWarning, "access") << "refused: " << s.message() << Suppressed(dropped);
  return s;
}

Status Cache::CheckCaller(const std::string& session, bool* admin) {
  std::lock_guard<std::mutex> lock(mu_);
  Status s = CheckSession(session);
  if (s.ok()) *admin = owners_.IsAdmin(sessions_[session].uid);
  return s;
}

void Cache::SetSessionLimits(const SessionLimits& limits) {
  std::lock_guard<std::mutex> lock(mu_);
  owners_.set_root_is_admin(limits.root_is_admin);
  max_leases_per_session_ = limits.max_leases_per_session;
}

std::vector<std::string> Cache::IdleSessions(std::chrono::milliseconds idle) {
  std::lock_guard<std::mutex> lock(mu_);
  std::set<std::string> busy;
  for (const auto& [id, a] : pending_) busy.insert(a.session);
  const auto now = std::chrono::steady_clock::now();
  std::vector<std::string> out;
  for (const auto& [id, sess] : sessions_) {
    if (sess.leases == 0 && !busy.count(id) && now - sess.last_used >= idle) out.push_back(id);
  }
  return out;
}

void Cache::DropLease(std::map<uint64_t, Lease>::iterator it) {
  auto sess = sessions_.find(it->second.session);
  if (sess != sessions_.end() && sess->second.leases > 0) --sess->second.leases;
  auto b = buffers_.find(it->second.buffer_id);
  leases_.erase(it);
  if (b != buffers_.end()) {
    --b->second.leases;
    MaybeFree(b->second);
  }
}

void Cache::DropMapper(Buf& buf, const std::string& session) {
  if (!buf.mappers.erase(session)) return;
  if (buf.state == BufState::kRetiring && buf.mappers.empty()) {
    used_ -= buf.capacity;
    TCE_LOG(kDebug, "cache") << "retired buffer=" << buf.id << " released by its last mapper";
    buffers_.erase(buf.id);
  }
}

void Cache::TakeUnmaps(const std::string& session, std::vector<uint64_t>* out) {
  auto it = sessions_.find(session);
  if (it == sessions_.end()) return;
  out->insert(out->end(), it->second.pending_unmap.begin(), it->second.pending_unmap.end());
  it->second.pending_unmap.clear();
}

void Cache::RecordFate(uint64_t id, Fate fate) {
  fates_[id] = fate;
  fate_order_.push_back(id);
  if (fate_order_.size() > kFatesKept) {
    fates_.erase(fate_order_.front());
    fate_order_.pop_front();
  }
}

void Cache::ReleaseBuffer(uint64_t buffer_id) {
  auto it = buffers_.find(buffer_id);
  if (it == buffers_.end()) return;
  Buf& buf = it->second;
  buf.allocation_id = 0;
  buf.state = buf.leases > 0 || buf.pins > 0 ? BufState::kDraining : BufState::kFree;
}

void Cache::MaybeFree(Buf& buf) {
  if (buf.state == BufState::kDraining && buf.leases == 0 && buf.pins == 0)
    buf.state = BufState::kFree;
}

CacheStats Cache::TallyLocked() const {
  CacheStats s;
  s.budget = budget_;
  s.used = used_ + reserved_;
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
  s.leases = leases_.size();
  s.buffers_created = buffers_created_;
  s.buffers_reused = buffers_reused_;
  s.persist_queue = (persist_ ? persist_->Queued() : 0) + in_flight_.size();
  const std::vector<FileKey> waiting = backups_ ? backups_->Waiting() : std::vector<FileKey>();
  s.backup_queue = waiting.size() + backups_in_flight_;
  for (const FileKey& key : waiting) {
    auto it = files_.find(key);
    if (it != files_.end()) s.backup_lag_bytes += it->second.size;
  }
  s.backed_up_files = backed_up_files_;
  s.backup_failures = backup_failures_;
  s.recovered_files = recovered_files_;
  s.ring_checksum_mismatches = recovery_mismatches_;
  s.backup_error = backup_error_;
  s.persisted_files = persisted_files_;
  s.persisted_bytes = persisted_bytes_;
  for (const auto& [key, f] : files_) {
    s.failed_files += f.state == FileState::kFailed;
    const int n = static_cast<int>(f.state);
    if (n > 0 && n < kFileStateSlots) ++s.files_by_state[n];
  }
  s.evicted_files = evicted_files_;
  s.discarded_files = discarded_files_;
  s.stale_drops = stale_drops_;
  s.storage_fallbacks = storage_fallbacks_;
  s.accepting = accepting_;
  return s;
}

std::string Cache::FullMessage(uint64_t need) const {
  CacheStats s = TallyLocked();
  return "cache full: need " + std::to_string(need) + " bytes (" + HumanBytes(need) +
         "), budget " + HumanBytes(s.budget) + ", used " + HumanBytes(s.used) + " (cached " +
         HumanBytes(s.cached) + ", pending " + HumanBytes(s.pending) + ", free " +
         HumanBytes(s.free) + ", retiring " + HumanBytes(s.retiring) + ")";
}

void Cache::Reclaim(const std::string& session, uint64_t need, std::vector<uint64_t>* unmap) {
  // Cheapest first: buffers nobody maps, then ours, then other sessions'
  // (those only free their bytes once every mapper has unmapped them).
  for (int pass = 0; pass < 3 && used_ + reserved_ + need > budget_; ++pass) {
    std::vector<uint64_t> victims;
    for (auto& [id, b] : buffers_) {
      if (b.state != BufState::kFree || b.leases) continue;
      bool only_us = b.mappers.size() == 1 && b.mappers.count(session);
      bool pick = pass == 0 ? b.mappers.empty() : pass == 1 ? only_us : !b.mappers.empty() && !only_us;
      if (pick) victims.push_back(id);
    }
    for (uint64_t id : victims) {
      if (used_ + reserved_ + need <= budget_) break;
      Buf& b = buffers_[id];
      if (pass == 2) {
        b.state = BufState::kRetiring;
        b.mem.reset();
        for (const auto& m : b.mappers) sessions_[m].pending_unmap.push_back(id);
        TCE_LOG(kInfo, "cache") << "retiring buffer=" << id << " capacity=" << b.capacity
                                << " (waiting for " << b.mappers.size() << " session(s) to unmap)";
        continue;
      }
      if (pass == 1) unmap->push_back(id);
      used_ -= b.capacity;
      TCE_LOG(kInfo, "cache") << "destroyed free buffer=" << id << " capacity=" << b.capacity;
      buffers_.erase(id);
    }
  }
}

Status Cache::SnapshotFor(const std::string& path, DiskIdentity* out) {
  if (roots_.empty()) return Status::OK();  // memory only: a path is a name
  // Numbered before looking, so an identity this server records later (a
  // write that lands meanwhile) is known to be newer.
  const uint64_t seq = ++disk_seq_;
  auto result = std::make_shared<std::pair<Status, DiskIdentity>>();
  Env* env = env_;
  std::vector<std::string> roots = roots_;
  std::string p = path;
  if (!prober_->Run([=] { result->first = SnapshotPath(env, roots, p, &result->second); })) {
    NoteStorageFallback(path, "storage did not answer in time; the save goes on unchecked");
    return Status::OK();
  }
  const Status& s = result->first;
  if (s.code() == Status::Code::kNotFound || s.code() == Status::Code::kPermissionDenied ||
      s.code() == Status::Code::kFailedPrecondition)
    return s;  // as torch.save would fail: no such directory, or not a file
  if (!s.ok()) {
    NoteStorageFallback(path, s.ToString() + "; the save goes on unchecked");
    return Status::OK();
  }
  *out = result->second;
  out->seq = seq;
  return Status::OK();
}

void Cache::NoteStorageFallback(const std::string& path, const std::string& why) {
  ++storage_fallbacks_;
  uint64_t dropped = 0;
  if (storage_log_.Allow(&dropped))
    TCE_LOG(kWarning, "cache") << "storage could not be checked for " << path << ": " << why
                               << Suppressed(dropped);
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
  a.file.created_unix_ns = NowNs();
  a.file.owner_uid = sessions_[req.session].uid;
  a.file.owner_gid = sessions_[req.session].gid;
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
  if (s.ok()) s = CheckUnderRoots(req.path);
  DiskIdentity disk;
  if (s.ok()) s = SnapshotFor(req.path, &disk);
  if (s.ok() && req.size > budget_)
    s = Status::ResourceExhausted("file of " + std::to_string(req.size) + " bytes (" +
                                  HumanBytes(req.size) + ") exceeds the cache budget of " +
                                  std::to_string(budget_) + " bytes (" + HumanBytes(budget_) + ")");
  std::unique_lock<std::mutex> lock(mu_);
  if (s.ok()) s = CheckAccess(req.session, req.job, "write " + req.path + " in job '" + req.job + "'",
                              /*claim=*/true);
  if (s.ok() && !accepting_) s = Status::Unavailable("the server is shutting down: it takes no new saves");
  if (!s.ok()) {
    TCE_LOG(kWarning, "cache") << "refused allocate job=" << req.job << " path=" << req.path
                               << " size=" << req.size << ": " << s.ToString();
    return s;
  }
  TakeUnmaps(req.session, &out->unmap_buffer_ids);

  const uint64_t capacity = std::min(CapacityFor(req.size), std::max(req.size, budget_));
  const auto deadline = std::chrono::steady_clock::now() + full_timeout_;
  while (true) {
    // 1. A free buffer that fits, never one another live session has mapped;
    //    ours first (no mmap, no fd passing), then the smallest.
    if (Buf* best = PickFree(req.session, req.size)) {
      ++buffers_reused_;
      StartAllocation(req, disk, *best, out);
      TCE_LOG(kInfo, "cache") << "allocated job=" << req.job << " tag=" << req.tag
                              << " path=" << req.path << " size=" << req.size
                              << " buffer=" << best->id << " (reused)";
      return Status::OK();
    }
    // 2. Room for a new buffer, after reclaiming free ones if need be.
    if (used_ + reserved_ + capacity > budget_) Reclaim(req.session, capacity, &out->unmap_buffer_ids);
    if (used_ + reserved_ + capacity <= budget_) break;
    // 3. Evict the least recently committed persisted file, and look again.
    if (EvictOne()) continue;
    // 4. Only unpersisted files hold the memory: wait for persistence to
    //    finish some (never evict what is not on storage), within bounds.
    if (persistence_enabled() && (PersistQueued() || !in_flight_.empty()) && !stopping_ &&
        done_cv_.wait_until(lock, deadline) != std::cv_status::timeout) {
      if (!sessions_.count(req.session)) return CheckSession(req.session);
      continue;
    }
    Status full = Status::ResourceExhausted(FullMessage(capacity));
    TCE_LOG(kWarning, "cache") << "refused allocate job=" << req.job << " path=" << req.path
                               << ": " << full.message();
    return full;
  }
  const uint64_t id = next_buffer_id_++;
  reserved_ += capacity;
  lock.unlock();
  std::unique_ptr<Buffer> mem;
  s = Buffer::Create(id, capacity, &mem);
  lock.lock();
  reserved_ -= capacity;
  if (!s.ok()) {
    TCE_LOG(kError, "cache") << "cannot create buffer of " << capacity << " bytes: " << s.ToString();
    return s;
  }
  if (!sessions_.count(req.session)) return CheckSession(req.session);  // closed meanwhile
  Buf& buf = buffers_[id];
  buf.mem = std::move(mem);
  buf.id = id;
  buf.capacity = capacity;
  used_ += capacity;
  ++buffers_created_;
  StartAllocation(req, disk, buf, out);
  TCE_LOG(kInfo, "cache") << "allocated job=" << req.job << " tag=" << req.tag
                          << " path=" << req.path << " size=" << req.size << " buffer=" << id
                          << " capacity=" << capacity << " (new)";
  return Status::OK();
}

Cache::Buf* Cache::PickFree(const std::string& session, uint64_t size) {
  Buf* best = nullptr;
  const uid_t uid = sessions_[session].uid;
  for (auto& [id, b] : buffers_) {
    if (b.state != BufState::kFree || !Fits(b.capacity, size)) continue;
    if (b.uid != uid) continue;  // it holds another user's bytes
    bool ours = b.mappers.count(session) != 0;
    if (b.mappers.size() > (ours ? 1u : 0u)) continue;
    bool best_ours = best && best->mappers.count(session) != 0;
    if (!best || (ours && !best_ours) || (ours == best_ours && b.capacity < best->capacity))
      best = &b;
  }
  return best;
}

bool Cache::Evictable(const FileInfo& f) {
  if (f.state != FileState::kPersisted) return false;
  const Buf& b = buffers_[f.buffer_id];
  return b.leases == 0 && b.pins == 0;  // nobody reads or writes its bytes
}

void Cache::Evict(FileInfo& f, const char* why) {
  TCE_LOG(kInfo, "cache") << "evicted job=" << f.job << " tag=" << f.tag << " path=" << f.path
                          << " size=" << f.size << " (" << why << ")";
  ReleaseBuffer(f.buffer_id);
  QueueDrop(f);
  f.state = FileState::kEvicted;
  f.buffer_id = 0;
  f.capacity = 0;
  ++evicted_files_;
  Note(f, false);
}

bool Cache::EvictOne() {
  FileInfo* victim = nullptr;
  for (auto& [key, f] : files_) {
    if (Evictable(f) && (!victim || f.committed_unix_ns < victim->committed_unix_ns)) victim = &f;
  }
  if (!victim) return false;
  Evict(*victim, "cache full");
  return true;
}

void Cache::EnforceKeepLast(const std::string& job) {
  if (keep_last_ == 0) return;
  std::map<std::string, int64_t> newest;  // tag -> its newest commit
  for (const auto& [key, f] : files_) {
    if (f.job != job || f.tag.empty() || f.state == FileState::kEvicted ||
        f.state == FileState::kDiscarded)
      continue;  // a tag that holds no memory takes no place among the newest
    newest[f.tag] = std::max(newest[f.tag], f.committed_unix_ns);
  }
  if (newest.size() <= keep_last_) return;
  std::vector<std::pair<int64_t, std::string>> order;
  for (const auto& [tag, t] : newest) order.emplace_back(t, tag);
  std::sort(order.rbegin(), order.rend());  // newest first
  std::set<std::string> old;
  for (size_t i = keep_last_; i < order.size(); ++i) old.insert(order[i].second);
  for (auto& [key, f] : files_) {
    if (f.job == job && old.count(f.tag) && Evictable(f)) Evict(f, "keep_last");
  }
}

Status Cache::FindAllocation(const std::string& session, uint64_t id,
                             std::map<uint64_t, Allocation>::iterator* it) {
  Status s = CheckSession(session);
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
  std::lock_guard<std::mutex> lock(mu_);
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
  if (pending_.empty()) quiet_cv_.notify_all();
  RecordFate(allocation_id, Fate::kCommitted);
  a.file.state = FileState::kCached;
  a.file.committed_unix_ns = NowNs();
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
  std::lock_guard<std::mutex> lock(mu_);
  std::map<uint64_t, Allocation>::iterator it;
  Status s = FindAllocation(session, allocation_id, &it);
  if (!s.ok()) return s;
  uint64_t buffer_id = it->second.buffer_id;
  TCE_LOG(kInfo, "cache") << "aborted allocation=" << allocation_id
                          << " path=" << it->second.file.path;
  pending_.erase(it);
  if (pending_.empty()) quiet_cv_.notify_all();
  RecordFate(allocation_id, Fate::kAborted);
  ReleaseBuffer(buffer_id);
  return Status::OK();
}

Status Cache::Lookup(const std::string& session, const std::string& job, const std::string& path,
                     bool lease, FileInfo* out, uint64_t* lease_id,
                     std::vector<uint64_t>* unmap_buffer_ids) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    Status s = CheckAccess(session, job, "read " + path + " of job '" + job + "'");
    if (!s.ok()) return s;
  }
  Revalidate({job, path});
  std::lock_guard<std::mutex> lock(mu_);
  Status s = CheckAccess(session, job, "read " + path + " of job '" + job + "'");
  if (!s.ok()) return s;
  if (lease && sessions_[session].leases >= max_leases_per_session_)
    return Status::ResourceExhausted("this session holds " + std::to_string(sessions_[session].leases) +
                                     " leases (max_leases_per_session=" +
                                     std::to_string(max_leases_per_session_) +
                                     "): release loaded files before loading more");
  TakeUnmaps(session, unmap_buffer_ids);
  auto it = files_.find({job, path});
  if (it == files_.end()) return Status::NotFound(path + " is not cached for job " + job);
  if (it->second.state == FileState::kEvicted)
    return Status::NotFound(path + " was evicted from the cache (it is on storage)");
  if (it->second.buffer_id == 0)  // re-indexed after a restart: the memory is gone
    return Status::NotFound(path + " is not in memory: " + it->second.reason);
  *out = it->second;
  *lease_id = 0;
  if (lease) {
    *lease_id = next_lease_id_++;
    leases_[*lease_id] = Lease{session, it->second.buffer_id};
    ++buffers_[it->second.buffer_id].leases;
    ++sessions_[session].leases;
  }
  return Status::OK();
}

DiskIdentity Cache::Written(const DiskIdentity& before, const FileStat& st) {
  DiskIdentity d = before;  // the same directory
  if (!before.known) return d;  // a recovered file: its directory was never seen
  d.exists = true;
  d.dev = st.dev;
  d.ino = st.ino;
  d.size = st.size;
  d.mtime_ns = st.mtime_ns;
  d.mode = st.mode & 07777;
  d.seq = ++disk_seq_;
  return d;
}

void Cache::LetGo(FileInfo& f, FileState state, const std::string& why) {
  ReleaseBuffer(f.buffer_id);
  QueueDrop(f);
  if (persist_) persist_->CancelRetry({f.job, f.path});
  f.state = state;
  f.reason = why;
  f.buffer_id = 0;
  f.capacity = 0;
  f.backup_holder.clear();
  Note(f, false);
  done_cv_.notify_all();
}

void Cache::Discard(FileInfo& f, const std::string& why) {
  TCE_LOG(kWarning, "cache") << "DISCARDED job=" << f.job << " tag=" << f.tag << " path=" << f.path
                             << ": " << why << " (the save is dropped, never persisted)";
  ++discarded_files_;
  LetGo(f, FileState::kDiscarded, why);
}

void Cache::DropStale(FileInfo& f, const std::string& why) {
  TCE_LOG(kInfo, "cache") << "dropped the cached copy of job=" << f.job << " path=" << f.path << ": "
                          << why << " (loads read storage)";
  ++stale_drops_;
  LetGo(f, FileState::kEvicted, why);
}

void Cache::Revalidate(const FileKey& key) {
  DiskIdentity expected;
  uint64_t version = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = files_.find(key);
    if (it == files_.end() || it->second.buffer_id == 0 || !it->second.disk.known ||
        it->second.state == FileState::kPending)
      return;
    // Being written now: the path changes under our own hand (the persister
    // makes the same check itself just before its rename).
    auto flying = in_flight_.find(key);
    if (flying != in_flight_.end() && flying->second == it->second.version) return;
    expected = it->second.disk;
    version = it->second.version;
  }
  auto result = std::make_shared<StorageCheck>();
  Env* env = env_;
  std::vector<std::string> roots = roots_;
  std::string path = key.second;
  StorageCheck c;
  if (prober_->Run([=] { *result = CheckPath(env, roots, path, expected); }))
    c = *result;
  else
    c = {Verdict::kUnavailable, "storage did not answer within " + std::to_string(check_timeout_.count()) + " ms"};
  if (c.verdict == Verdict::kSame) return;
  std::lock_guard<std::mutex> lock(mu_);
  auto it = files_.find(key);
  if (it == files_.end() || it->second.version != version || it->second.buffer_id == 0) return;
  if (it->second.disk.seq != expected.seq || in_flight_.count(key)) return;  // we wrote it meanwhile
  if (c.verdict == Verdict::kUnavailable) {
    NoteStorageFallback(key.second, c.why + "; the cached copy is served");
  } else if (it->second.state == FileState::kPersisted) {
    DropStale(it->second, c.why);
  } else {
    Discard(it->second, c.why);
  }
}

void Cache::SetStorageCheckTimeout(std::chrono::milliseconds timeout) {
  std::lock_guard<std::mutex> lock(mu_);
  check_timeout_ = timeout;
  prober_ = std::make_unique<Prober>(timeout);
}

Status Cache::Release(const std::string& session, const std::vector<uint64_t>& lease_ids,
                      const std::vector<uint64_t>& unmapped_buffer_ids) {
  std::lock_guard<std::mutex> lock(mu_);
  Status s = CheckSession(session);
  if (!s.ok()) return s;
  for (uint64_t id : lease_ids) {
    auto it = leases_.find(id);
    if (it == leases_.end() || it->second.session != session)
      return Status::NotFound("unknown lease " + std::to_string(id) + " for this session");
  }
  for (uint64_t id : lease_ids) {
    auto it = leases_.find(id);
    if (it != leases_.end()) DropLease(it);  // (an id listed twice is gone the second time)
  }
  for (uint64_t id : unmapped_buffer_ids) {
    auto b = buffers_.find(id);
    if (b != buffers_.end()) DropMapper(b->second, session);
  }
  return Status::OK();
}

Status Cache::Remove(const std::string& session, const std::string& job, const std::string& path,
                     FileInfo* out) {
  std::lock_guard<std::mutex> lock(mu_);
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

Status Cache::CommitTag(const std::string& session, TagInfo tag, TagInfo* out) {
  const std::string why = TagRegistry::Check(&tag);
  std::lock_guard<std::mutex> lock(mu_);
  Status s = CheckSession(session);
  if (s.ok() && why.empty())
    s = CheckAccess(session, tag.job, "commit tag '" + tag.tag + "' into job '" + tag.job + "'",
                    /*claim=*/true);
  if (!s.ok()) return s;
  if (!why.empty()) {
    TCE_LOG(kWarning, "cache") << "refused tag job=" << tag.job << " tag=" << tag.tag << ": " << why;
    return Status::InvalidArgument(why);
  }
  TCE_LOG(kInfo, "cache") << "tag complete job=" << tag.job << " tag=" << tag.tag
                          << " files=" << tag.files.size() << " world_size=" << tag.world_size;
  // Under mu_, so that RecordAll sees a tag either recorded here or in the registry.
  *out = tags_.Complete(std::move(tag), NowNs());
  if (meta_) meta_->RecordTag(*out);
  return Status::OK();
}

std::vector<TagInfo> Cache::ListTags(const std::string& job) { return tags_.List(job); }

Status Cache::ListTags(const std::string& session, const std::string& job,
                       std::vector<TagInfo>* out) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    Status s = CheckAccess(session, job, "list the tags of job '" + job + "'");
    if (!s.ok()) return s;
  }
  *out = ListTags(job);  // (ownership never changes once set)
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
  std::lock_guard<std::mutex> lock(mu_);
  Status s = CheckSession(session);
  if (!s.ok()) return s;
  const uid_t uid = sessions_[session].uid;
  out->clear();
  for (FileInfo& f : all)
    if (owners_.Visible(uid, f.job)) out->push_back(std::move(f));
  return Status::OK();
}

void Cache::RestoreTags(std::vector<TagInfo> tags) {
  const size_t n = tags_.Restore(std::move(tags));
  TCE_LOG(kInfo, "cache") << "re-indexed " << n << " complete tag(s) from metadata";
}

std::vector<FileInfo> Cache::List(const std::string& job, const std::string& tag) {
  std::lock_guard<std::mutex> lock(mu_);
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

Status Cache::FdFor(const std::string& session, uint64_t buffer_id, int* fd, bool* writable,
                    uint64_t* capacity) {
  std::lock_guard<std::mutex> lock(mu_);
  Status s = CheckSession(session);
  if (!s.ok()) return s;
  auto it = buffers_.find(buffer_id);
  if (it == buffers_.end() || !it->second.mem)
    return Status::NotFound("unknown buffer " + std::to_string(buffer_id));
  Buf& b = it->second;
  bool owns = b.state == BufState::kPending && pending_.count(b.allocation_id) &&
              pending_[b.allocation_id].session == session;
  bool leased = false;
  if (!owns) {
    for (const auto& [id, l] : leases_)
      if (l.buffer_id == buffer_id && l.session == session) leased = true;
  }
  if (!owns && !leased)
    return Status::PermissionDenied("buffer " + std::to_string(buffer_id) +
                                    " is not allocated to or leased by this session");
  s = b.mem->NewFd(owns, fd);
  if (!s.ok()) return s;
  if (owns) b.mappers.insert(session);
  *writable = owns;
  *capacity = b.capacity;
  return Status::OK();
}

Status Cache::Wait(const std::string& session, const std::string& job,
                   const std::vector<std::string>& paths, std::chrono::milliseconds timeout,
                   std::vector<FileInfo>* out) {
  std::unique_lock<std::mutex> lock(mu_);
  Status s = CheckAccess(session, job, "wait for files of job '" + job + "'");
  if (!s.ok()) return s;
  if (!persistence_enabled())
    return Status::FailedPrecondition(
        "persistence is off (the server has no storage_roots): files live in memory only");
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (true) {
    out->clear();
    std::vector<std::string> unfinished;
    for (const std::string& path : paths) {
      auto it = files_.find({job, path});
      if (it == files_.end()) return Status::NotFound(path + " is not cached for job " + job);
      if (it->second.state == FileState::kCached || it->second.state == FileState::kBackedUp)
        unfinished.push_back(path);
      out->push_back(it->second);
    }
    if (unfinished.empty()) return Status::OK();
    if (stopping_) return Status::Unavailable("the server is shutting down");
    if (timeout.count() <= 0) {
      done_cv_.wait(lock);
    } else if (done_cv_.wait_until(lock, deadline) == std::cv_status::timeout) {
      return Status::DeadlineExceeded(std::to_string(unfinished.size()) + " of " + std::to_string(paths.size()) +
                        " file(s) not persisted yet, e.g. " + unfinished[0]);
    }
  }
}

void Cache::SetPersistFeed(PersistFeed* feed) {
  std::lock_guard<std::mutex> lock(mu_);
  persist_ = feed;
}

void Cache::QueuePersist(const FileKey& key) {
  if (persistence_enabled() && persist_) persist_->Queue(key);
}

bool Cache::PersistQueued() const { return persist_ && persist_->Queued() > 0; }

void Cache::FailPersist(FileInfo& f, const Status& why) {
  f.state = FileState::kFailed;
  f.reason = why.ToString();
  const Status::Code c = why.code();
  const bool may_clear = c == Status::Code::kResourceExhausted || c == Status::Code::kInternal ||
                         c == Status::Code::kUnavailable || c == Status::Code::kDeadlineExceeded;
  if (may_clear && f.buffer_id != 0 && persist_) {
    const std::chrono::milliseconds every = persist_->RetryLater({f.job, f.path});
    if (every.count() > 0)
      f.reason += " (persisted again every " + std::to_string(every.count() / 1000.0).substr(0, 4) +
                  " s while in memory)";
  }
  Note(f, false);
  done_cv_.notify_all();
}

void Cache::Reopen(FileInfo& f) {
  TCE_LOG(kInfo, "persist") << "persisting again job=" << f.job << " path=" << f.path
                            << " (failed: " << f.reason << ")";
  f.state = f.backup_holder.empty() ? FileState::kCached : FileState::kBackedUp;
  f.reason.clear();
  Note(f, false);
}

void Cache::Requeue(FileInfo& f) {
  if (persist_) persist_->CancelRetry({f.job, f.path});
  Reopen(f);
  QueuePersist({f.job, f.path});
}

Status Cache::RetryFailed(const std::string& session, const std::string& job,
                          const std::vector<std::string>& paths, std::vector<FileInfo>* out) {
  std::lock_guard<std::mutex> lock(mu_);
  if (job.empty()) return Status::InvalidArgument("retry needs a job");
  Status s = CheckAccess(session, job, "retry files of job '" + job + "'");
  if (!s.ok()) return s;
  if (!persistence_enabled())
    return Status::FailedPrecondition("this server persists nothing (no storage_roots)");
  std::vector<FileInfo*> chosen;
  if (paths.empty()) {
    for (auto& [key, f] : files_)
      if (key.first == job && f.state == FileState::kFailed && f.buffer_id != 0) chosen.push_back(&f);
  }
  for (const std::string& path : paths) {
    auto it = files_.find({job, path});
    if (it == files_.end()) return Status::NotFound("no file " + path + " in job " + job);
    FileInfo& f = it->second;
    if (f.state != FileState::kFailed)
      return Status::FailedPrecondition(path + " is " + FileStateName(f.state) + ", not FAILED: nothing to retry");
    if (f.buffer_id == 0)
      return Status::FailedPrecondition(path + " is no longer in memory (" + f.reason +
                                        "): only a new save can bring it back");
    chosen.push_back(&f);
  }
  for (FileInfo* f : chosen) {
    Requeue(*f);
    out->push_back(*f);
  }
  return Status::OK();
}

bool Cache::StartPersist(const FileKey& key, bool retry, PersistJob* out) {
  std::lock_guard<std::mutex> lock(mu_);
  if (stopping_) return false;
  auto it = files_.find(key);
  if (it == files_.end()) return false;  // removed
  FileInfo& f = it->second;
  if (retry) {  // a scheduled attempt: only at a file still FAILED with its memory
    if (f.state != FileState::kFailed || f.buffer_id == 0) return false;
    Reopen(f);
  }
  if (f.state != FileState::kCached && f.state != FileState::kBackedUp) return false;  // gone or done
  auto flying = in_flight_.find(key);
  if (flying != in_flight_.end() && flying->second == f.version) return false;
  Buf& buf = buffers_[f.buffer_id];
  int fd = -1;
  Status s = buf.mem->NewFd(/*writable=*/true, &fd);
  if (!s.ok()) {  // e.g. out of descriptors: that clears
    FailPersist(f, s);
    return false;
  }
  ++buf.pins;
  in_flight_[key] = f.version;
  out->job = key.first;
  out->path = key.second;
  out->version = f.version;
  out->buffer_id = buf.id;
  out->size = f.size;
  out->capacity = buf.capacity;
  out->uid = f.owner_uid;
  out->gid = f.owner_gid;
  out->new_mode = f.new_mode;
  out->zip_crc32 = f.zip_crc32;
  out->expected = f.disk;
  out->records = f.records;
  out->fd = fd;
  return true;
}

std::chrono::milliseconds Cache::WaitForNoSaves(std::chrono::milliseconds max) {
  std::unique_lock<std::mutex> lock(mu_);
  if (pending_.empty() || stopping_) return std::chrono::milliseconds(0);
  const auto t0 = std::chrono::steady_clock::now();
  quiet_cv_.wait_for(lock, max, [this] { return pending_.empty() || stopping_; });
  return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - t0);
}

bool Cache::IsCurrent(const PersistJob& job) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = files_.find({job.job, job.path});
  return it != files_.end() && it->second.version == job.version;
}

void Cache::FinishPersist(const PersistJob& job, const Status& result,
                          std::vector<Record> records, const FileStat& written) {
  std::lock_guard<std::mutex> lock(mu_);
  auto b = buffers_.find(job.buffer_id);
  if (b != buffers_.end()) {
    --b->second.pins;
    MaybeFree(b->second);
  }
  auto flying = in_flight_.find({job.job, job.path});
  if (flying != in_flight_.end() && flying->second == job.version) in_flight_.erase(flying);
  auto it = files_.find({job.job, job.path});
  if (it != files_.end() && it->second.version != job.version && result.ok() &&
      it->second.disk.known && job.expected.known) {
    // Superseded as it was renamed into place: the newer version must
    // expect the file this one left.
    it->second.disk = Written(job.expected, written);
    return;
  }
  if (it == files_.end() || it->second.version != job.version) return;  // superseded
  if (result.code() == Status::Code::kCancelled) {
    Discard(it->second, result.message());
  } else if (result.ok()) {
    it->second.disk = Written(job.expected, written);
    it->second.state = FileState::kPersisted;
    it->second.persisted_unix_ns = NowNs();
    it->second.records = std::move(records);
    ++persisted_files_;
    persisted_bytes_ += job.size;
    Note(it->second, false);
    EnforceKeepLast(job.job);
  } else {
    FailPersist(it->second, result);
  }
  done_cv_.notify_all();
}

void Cache::SetBackupFeed(BackupFeed* feed) {
  std::lock_guard<std::mutex> lock(mu_);
  backups_ = feed;
}

void Cache::QueueBackup(const FileKey& key) {
  if (!rings_.Successor(key.first).empty() && backups_) backups_->Send(key);
}

void Cache::QueueDrop(const FileInfo& f) {
  if (f.backup_holder.empty() || !backups_) return;
  backups_->Drop(DropCopy{f.job, f.path, f.backup_holder, f.version});
}

Status Cache::SetRing(const std::string& session, const std::string& job, int32_t node_rank,
                      std::vector<std::string> endpoints, std::string* successor) {
  std::lock_guard<std::mutex> lock(mu_);
  Status s = CheckSession(session);
  if (!s.ok()) return s;
  if (job.empty()) return Status::InvalidArgument("a ring needs a job");
  s = CheckAccess(session, job, "set the ring of job '" + job + "'", /*claim=*/true);
  if (!s.ok()) return s;
  s = RingTable::Check(job, node_rank, endpoints);
  if (!s.ok()) return s;
  if (meta_ && !self_endpoint_.empty()) meta_->RecordRing(RingInfo{job, self_endpoint_, node_rank, endpoints});
  *successor = InstallRing(job, node_rank, std::move(endpoints));
  const Session& who = sessions_.at(session);
  rings_.SetOwner(job, who.uid, who.gid);
  return Status::OK();
}

void Cache::SetSelfEndpoint(const std::string& endpoint) {
  std::lock_guard<std::mutex> lock(mu_);
  self_endpoint_ = endpoint;
}

void Cache::RestoreRings(std::vector<RingInfo> rings) {
  std::lock_guard<std::mutex> lock(mu_);
  for (RingInfo& r : rings) {
    if (!RingTable::Check(r.job, r.node_rank, r.endpoints).ok()) continue;
    TCE_LOG(kInfo, "ring") << "rejoining the ring of job=" << r.job << " recorded in metadata";
    InstallRing(r.job, r.node_rank, std::move(r.endpoints));
  }
}

std::string Cache::InstallRing(const std::string& job, int32_t node_rank, std::vector<std::string> endpoints) {
  const bool changed = rings_.Install(job, node_rank, std::move(endpoints));
  const Ring& ring = *rings_.Find(job);
  bool empty = true;  // nothing of this job in memory: a fresh or restarted node
  for (const auto& [key, f] : files_) empty = empty && !(key.first == job && f.buffer_id != 0);
  for (const auto& [id, a] : pending_) empty = empty && a.file.job != job;
  if (empty && !ring.successor.empty() && backups_)
    backups_->Recover(RecoverJob{job, node_rank, ring.successor, ring.Predecessor()});
  TCE_LOG(kInfo, "ring") << "job=" << job << " node " << node_rank << " of "
                         << ring.endpoints.size() << ", successor "
                         << (ring.successor.empty() ? "none" : ring.successor);
  const std::string successor = ring.successor;
  if (changed) {  // back up what is cached already (to the new successor)
    for (auto& [key, f] : files_) {
      if (key.first != job || f.buffer_id == 0 || f.state == FileState::kEvicted ||
          f.state == FileState::kFailed)
        continue;
      f.backup_holder.clear();
      QueueBackup(key);
    }
  }
  return successor;
}

bool Cache::StartBackup(const FileKey& key, BackupJob* out) {
  std::unique_lock<std::mutex> lock(mu_);
  auto it = files_.find(key);
  const std::string successor = rings_.Successor(key.first);
  if (it == files_.end() || successor.empty()) return false;
  FileInfo& f = it->second;
  if (f.buffer_id == 0 || f.state == FileState::kEvicted || f.state == FileState::kFailed ||
      f.state == FileState::kPending || f.backup_holder == successor)
    return false;  // gone, not in memory, or already held there
  Buf& buf = buffers_[f.buffer_id];
  int fd = -1;
  if (!buf.mem->NewFd(/*writable=*/false, &fd).ok()) return false;
  ++buf.pins;
  ++backups_in_flight_;
  *out = BackupJob();
  out->job = f.job;
  out->tag = f.tag;
  out->path = f.path;
  out->rank = f.rank;
  out->peer = successor;
  out->node = rings_.Find(key.first)->node_rank;
  out->version = f.version;
  out->buffer_id = buf.id;
  out->size = f.size;
  out->records = f.records;
  out->fd = fd;
  out->data = nullptr;
  Buffer* mem = buf.mem.get();
  lock.unlock();  // mapping a new buffer faults it in: not under the lock
  if (!mem->Mapping(&out->data).ok()) out->data = nullptr;
  return true;
}

void Cache::FinishBackup(const BackupJob& job, const Status& result) {
  std::lock_guard<std::mutex> lock(mu_);
  --backups_in_flight_;
  auto b = buffers_.find(job.buffer_id);
  if (b != buffers_.end()) {
    --b->second.pins;
    MaybeFree(b->second);
  }
  auto it = files_.find({job.job, job.path});
  const bool current = it != files_.end() && it->second.version == job.version &&
                       it->second.buffer_id != 0;
  if (!result.ok()) {
    ++backup_failures_;
    backup_error_ = job.peer + ": " + result.ToString();
    if (current && backups_) backups_->Send({job.job, job.path});  // again, after the worker's backoff
    return;
  }
  ++backed_up_files_;
  if (!current) return;  // superseded or evicted meanwhile; the next version goes too
  it->second.backup_holder = job.peer;
  if (it->second.state == FileState::kCached) it->second.state = FileState::kBackedUp;
  Note(it->second, false);
}

Status Cache::ReserveRecovery(uint64_t size, std::unique_ptr<Buffer>* out) {
  std::unique_lock<std::mutex> lock(mu_);
  const uint64_t capacity = CapacityFor(size);
  std::vector<uint64_t> ignored;
  while (used_ + reserved_ + capacity > budget_) {
    Reclaim("", capacity, &ignored);
    if (used_ + reserved_ + capacity <= budget_) break;
    if (!EvictOne()) return Status::ResourceExhausted(FullMessage(capacity));
  }
  const uint64_t id = next_buffer_id_++;
  reserved_ += capacity;
  lock.unlock();
  Status s = Buffer::Create(id, capacity, out);
  if (!s.ok()) {
    lock.lock();
    reserved_ -= capacity;
  }
  return s;
}

void Cache::AbandonRecovery(std::unique_ptr<Buffer> mem) {
  if (!mem) return;
  std::lock_guard<std::mutex> lock(mu_);
  reserved_ -= mem->capacity();
}

Status Cache::AdoptRecovered(FileInfo f, std::unique_ptr<Buffer> mem) {
  // A peer's copy is checked like a save (its names) and against what this
  // server knows (its metadata, the ring's owner): a peer never names a path,
  // an owner or a size of its own choosing.
  Status s = ValidateName("job", f.job, /*allow_empty=*/false, /*allow_slash=*/true);
  if (s.ok()) s = ValidateName("tag", f.tag, /*allow_empty=*/true, /*allow_slash=*/false);
  if (s.ok()) s = ValidatePath(f.path);
  if (s.ok()) s = CheckUnderRoots(f.path);
  std::lock_guard<std::mutex> lock(mu_);
  reserved_ -= mem->capacity();
  if (!s.ok()) return Status::PermissionDenied("the ring's copy of " + f.path + " is refused: " + s.message());
  FileKey key{f.job, f.path};
  auto it = files_.find(key);
  if (it != files_.end() && it->second.buffer_id != 0)
    return Status::FailedPrecondition(f.path + " was saved again meanwhile: the newer copy stays");
  if (it != files_.end()) {  // known from metadata: size, owner and CRCs are metadata's
    const FileInfo& known = it->second;
    if (known.size != 0 && known.size != f.size) {
      ++recovery_mismatches_;
      return Status::DataLoss("the ring's copy of " + f.path + " has " + std::to_string(f.size) +
                              " bytes, metadata " + std::to_string(known.size) + ": storage serves it");
    }
    for (const Record& k : known.records) {
      if (k.crc32 == 0 && k.size > 0) continue;  // never checksummed (not persisted)
      auto same = std::find_if(f.records.begin(), f.records.end(),
                               [&](const Record& r) { return r.name == k.name; });
      if (same == f.records.end() || same->crc32 != k.crc32 || same->size != k.size) {
        ++recovery_mismatches_;
        return Status::DataLoss("the ring's copy of " + f.path + " does not match the checksums in "
                                "metadata (record " + k.name + "): storage serves it");
      }
    }
    f.owner_uid = known.owner_uid;
    f.owner_gid = known.owner_gid;
  } else {  // unknown here: it belongs to whoever told us the job's ring
    const Ring* ring = rings_.Find(f.job);
    if (!ring || !ring->has_owner)
      return Status::PermissionDenied("the ring's copy of " + f.path + " is refused: job " + f.job +
                                      " has no owner on this server (its ring came from metadata, "
                                      "which does not know the file)");
    f.owner_uid = ring->owner_uid;
    f.owner_gid = ring->owner_gid;
  }
  const uint64_t id = mem->id();
  Buf& buf = buffers_[id];
  buf.id = id;
  buf.capacity = mem->capacity();
  buf.mem = std::move(mem);
  buf.state = BufState::kCached;
  buf.uid = f.owner_uid;
  used_ += buf.capacity;
  ++buffers_created_;
  f.buffer_id = id;
  f.capacity = buf.capacity;
  f.state = FileState::kBackedUp;
  f.version = next_allocation_id_++;
  f.committed_unix_ns = NowNs();
  f.reason.clear();
  files_[key] = f;
  ++recovered_files_;
  Note(f, false);
  QueuePersist(key);  // it may never have reached storage
  TCE_LOG(kInfo, "ring") << "recovered job=" << f.job << " path=" << f.path << " size=" << f.size
                         << " from " << f.backup_holder;
  return Status::OK();
}

std::vector<std::string> Cache::RingPeers(const std::string& job) {
  std::lock_guard<std::mutex> lock(mu_);
  const Ring* ring = rings_.Find(job);
  return ring ? ring->Peers() : std::vector<std::string>();
}

bool Cache::MayBeInRing(const std::string& job, const std::string& path) {
  std::lock_guard<std::mutex> lock(mu_);
  if (rings_.Successor(job).empty()) return false;
  auto it = files_.find({job, path});
  return it == files_.end() || (it->second.buffer_id == 0 && it->second.state != FileState::kEvicted &&
                                 it->second.state != FileState::kDiscarded);
}

void Cache::StopAccepting() {
  std::lock_guard<std::mutex> lock(mu_);
  accepting_ = false;
}

std::vector<std::string> Cache::Unfinished(bool* allocations_in_flight) {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<std::string> out;
  *allocations_in_flight = !pending_.empty();
  for (const auto& [key, f] : files_) {
    if (f.state == FileState::kPending) continue;  // counted in pending_
    const bool persists = !roots_.empty() && (f.state == FileState::kCached || f.state == FileState::kBackedUp);
    const bool backs_up = !rings_.Successor(key.first).empty() &&
                          f.backup_holder.empty() && f.buffer_id != 0 && f.state != FileState::kEvicted;
    if (persists || backs_up)
      out.push_back("job=" + key.first + " path=" + key.second + ":" + (persists ? " not persisted" : "") +
                    (backs_up ? " not backed up" : ""));
  }
  return out;
}

void Cache::ResendBackups(const std::string& job, const std::string& peer) {
  std::lock_guard<std::mutex> lock(mu_);
  size_t n = 0;
  for (auto& [key, f] : files_) {
    if (key.first != job || f.backup_holder != peer) continue;
    f.backup_holder.clear();
    if (f.state == FileState::kBackedUp) f.state = FileState::kCached;
    QueueBackup(key);
    ++n;
  }
  TCE_LOG(kInfo, "ring") << peer << " lost its copies of job=" << job << ": re-sending " << n
                         << " file(s)";
}

void Cache::NoteBackupError(const std::string& message) {
  std::lock_guard<std::mutex> lock(mu_);
  ++backup_failures_;
  backup_error_ = message;
}

void Cache::StopPersistence() {
  std::lock_guard<std::mutex> lock(mu_);
  stopping_ = true;
  done_cv_.notify_all();
  quiet_cv_.notify_all();
}

CacheStats Cache::Stats() {
  std::lock_guard<std::mutex> lock(mu_);
  return TallyLocked();
}

void Cache::RecordAll() {
  std::lock_guard<std::mutex> lock(mu_);
  if (!meta_) return;
  for (const auto& [key, f] : files_) meta_->Record(f, false);
  for (const TagInfo& t : tags_.All()) meta_->RecordTag(t);
  if (!self_endpoint_.empty())
    for (const RingInfo& r : rings_.All(self_endpoint_)) meta_->RecordRing(r);
  TCE_LOG(kInfo, "cache") << "recorded " << files_.size() << " file(s) and " << tags_.size()
                          << " tag(s) again for a fresh metadata database";
}

}  // namespace tce
