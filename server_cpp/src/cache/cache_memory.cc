// Cache: memory. The pool of free buffers, making room
// within the budget, and eviction (least recently committed persisted file
// first; keep_last).
#include "cache/cache.h"

#include <algorithm>
#include <map>
#include <set>

#include "common/logging.h"
#include "common/strings.h"

namespace tce {

bool Cache::ReservePool(uint64_t bytes) {
  MutexLock lock(&mu_);
  if (!accepting_ || Held() + pooled_ + bytes > budget_) return false;
  pooled_ += bytes;
  return true;
}

void Cache::ReturnPool(uint64_t bytes) {
  MutexLock lock(&mu_);
  pooled_ -= std::min(pooled_, bytes);
}

bool Cache::Borrow(uint64_t bytes) {
  {
    MutexLock lock(&mu_);
    // Only free buffers nobody maps give way, as they would to a new
    // buffer: evicting a file or retiring a mapped buffer would cost a load
    // or a save more than the borrower gains (it works without).
    if (Held() + bytes > budget_) Reclaim("", bytes, nullptr, /*passes=*/1);
    if (Held() + bytes > budget_) return false;
    lent_ += bytes;
  }
  ShedPool();  // like a new buffer, borrowed bytes take the pool's memory first
  return true;
}

void Cache::GiveBack(uint64_t bytes) {
  MutexLock lock(&mu_);
  lent_ -= std::min(lent_, bytes);
  done_cv_.SignalAll();  // a save waiting for room looks again
}

void Cache::ShedPool() {
  if (!pool_) return;
  uint64_t excess = 0;
  {
    MutexLock lock(&mu_);
    const uint64_t total = Held() + pooled_;
    excess = total > budget_ ? total - budget_ : 0;
  }
  if (excess) pool_->Shed(excess);  // the budget holds buffers first
}

Status Cache::NewBuffer(uint64_t id, uint64_t capacity, std::unique_ptr<Buffer>* out) {
  int fd = -1;
  const bool pooled = pool_ && pool_->Take(capacity, &fd).ok();
  ShedPool();
  if (pooled) return Buffer::Adopt(id, fd, capacity, pool_->backing(), out);
  Status s = Buffer::Create(id, capacity, backing_, out);
  if (s.code() != Status::Code::kResourceExhausted || backing_ != Backing::kHugetlb) return s;
  ++hugetlb_fallbacks_;
  uint64_t suppressed = 0;
  if (fallback_log_.Allow(&suppressed))
    TCE_LOG(kWarning, "cache") << "no free huge page for a buffer of " << HumanBytes(capacity)
                               << ": made with 4 KiB pages (reserve more in /proc/sys/vm/nr_hugepages)"
                               << Suppressed(suppressed);
  return Buffer::Create(id, capacity, Backing::k4k, out);
}

void Cache::ReleaseBuffer(uint64_t buffer_id) {
  auto it = buffers_.find(buffer_id);
  if (it == buffers_.end()) return;
  Buf& buf = it->second;
  buf.allocation_id = 0;
  if (buf.leases > 0 || buf.pins > 0)
    buf.state = BufState::kDraining;
  else
    FreeBuffer(buf);
}

void Cache::MaybeFree(Buf& buf) {
  if (buf.state == BufState::kDraining && buf.leases == 0 && buf.pins == 0) FreeBuffer(buf);
}

Cache::Buf& Cache::Install(std::unique_ptr<Buffer> mem, bool created) {
  const uint64_t id = mem->id();
  Buf& buf = buffers_[id];
  buf.id = id;
  buf.capacity = mem->capacity();
  buf.mem = std::move(mem);
  used_ += buf.capacity;
  if (created) ++counts_.buffers_created;
  return buf;
}

void Cache::FreeBuffer(Buf& buf) {
  done_cv_.SignalAll();  // a save waiting for room looks again
  if (!buf.no_reuse) {
    buf.state = BufState::kFree;
    return;
  }
  // Its pages go now (Buffer's destructor), whoever still maps them.
  const uint64_t id = buf.id;
  used_ -= buf.capacity;
  buf.mem.reset();
  DropReaders(buf);
  if (buf.mappers.empty()) {
    TCE_LOG(kDebug, "cache") << "destroyed buffer=" << id << " (read by another uid or past a lease: not reused)";
    buffers_.erase(id);
    return;
  }
  buf.state = BufState::kRetiring;
  for (const auto& m : buf.mappers) sessions_.OweUnmap(m, id);
}

std::string Cache::FullMessage(uint64_t need) const {
  CacheStats s = TallyLocked();
  // What holds the memory that could not be given back, and why.
  uint64_t unpersisted = 0, leased = 0, pinned = 0;
  for (const auto& [id, b] : buffers_) {
    if (b.state == BufState::kRetiring) continue;
    if (b.leases > 0) leased += b.capacity;
    else if (b.pins > 0) pinned += b.capacity;
  }
  for (const auto& [key, f] : files_) {
    auto b = buffers_.find(f.buffer_id);
    if (f.buffer_id != 0 && f.state != FileState::kPersisted && b != buffers_.end() && !b->second.leases &&
        !b->second.pins)
      unpersisted += b->second.capacity;
  }
  std::string why = "; kept: " + HumanBytes(unpersisted) +
                    (persistence_enabled() ? " of files not yet on storage" : " of files (memory only: never evicted)") +
                    ", " + HumanBytes(leased) + " read by loads (leased), " + HumanBytes(pinned) +
                    " being persisted or backed up" +
                    (lent_ ? ", " + HumanBytes(lent_) + " in range buffers" : std::string());
  return "cache full: need " + std::to_string(need) + " bytes (" + HumanBytes(need) +
         "), budget " + HumanBytes(s.budget) + ", used " + HumanBytes(s.used) + " (cached " +
         HumanBytes(s.cached) + ", pending " + HumanBytes(s.pending) + ", free " + HumanBytes(s.free) + ")" +
         why;
}

void Cache::Reclaim(const std::string& session, uint64_t need, std::vector<uint64_t>* unmap,
                    int passes) {
  // Cheapest first: buffers nobody maps, then ours, then other sessions'
  // (retired: their pages are punched out at once, so the room is ours now;
  // the entry stays until every mapper has been told to unmap it).
  for (int pass = 0; pass < passes && Held() + need > budget_; ++pass) {
    std::vector<uint64_t> victims;
    for (auto& [id, b] : buffers_) {
      if (b.state != BufState::kFree || b.leases) continue;
      bool only_us = b.mappers.size() == 1 && b.mappers.count(session);
      bool pick = pass == 0 ? b.mappers.empty() : pass == 1 ? only_us : !b.mappers.empty() && !only_us;
      if (pick) victims.push_back(id);
    }
    for (uint64_t id : victims) {
      if (Held() + need <= budget_) break;
      Buf& b = buffers_[id];
      if (pass == 2) {
        b.state = BufState::kRetiring;
        b.mem.reset();  // frees its pages, mapped elsewhere or not (Buffer's destructor)
        used_ -= b.capacity;
        DropReaders(b);
        for (const auto& m : b.mappers) sessions_.OweUnmap(m, id);
        TCE_LOG(kInfo, "cache") << "retired buffer=" << id << " capacity=" << b.capacity << " (freed; "
                                << b.mappers.size() << " session(s) told to unmap it)";
        continue;
      }
      if (pass == 1) unmap->push_back(id);
      used_ -= b.capacity;
      TCE_LOG(kInfo, "cache") << "destroyed free buffer=" << id << " capacity=" << b.capacity;
      DropReaders(b);
      buffers_.erase(id);
    }
  }
}

Cache::Buf* Cache::PickFree(const std::string& session, uint64_t size) {
  Buf* best = nullptr;
  const uid_t uid = sessions_.Find(session)->uid;
  for (auto& [id, b] : buffers_) {
    if (b.state != BufState::kFree || !Buffer::Fits(b.capacity, size)) continue;
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
  ++counts_.evicted_files;
  Note(f, false);
}

bool Cache::EvictOne() {
  FileInfo* victim = nullptr;
  for (auto& [key, f] : files_) {
    if (Evictable(f) && (!victim || f.committed_unix_ns < victim->committed_unix_ns)) victim = &f;
  }
  // A replica of a followed version nobody reads goes as a persisted file
  // does: the node it came from still holds it.
  auto replica = replica_files_.end();
  for (auto it = replica_files_.begin(); it != replica_files_.end(); ++it) {
    const Buf& b = buffers_[it->second.buffer_id];
    if (b.leases == 0 && b.pins == 0 &&
        (replica == replica_files_.end() || it->second.committed_unix_ns < replica->second.committed_unix_ns))
      replica = it;
  }
  if (replica != replica_files_.end() &&
      (!victim || replica->second.committed_unix_ns < victim->committed_unix_ns)) {
    TCE_LOG(kInfo, "cache") << "evicted replica job=" << replica->second.job << " path=" << replica->second.path
                            << " (cache full)";
    ReleaseBuffer(replica->second.buffer_id);
    replica_files_.erase(replica);
    return true;
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

}  // namespace tce
