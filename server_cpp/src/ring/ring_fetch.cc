#include "ring/ring_fetch.h"

#include "common/logging.h"

namespace tce {
namespace {
constexpr size_t kMaxRemembered = 4096;
}  // namespace

RingFetch::RingFetch(ClientStore* cache, RingMembers* ring, RestoreTracker* restores, Fetch fetch, Stage stage,
                     std::chrono::milliseconds miss_ttl, Clock* clock)
    : cache_(cache),
      ring_(ring),
      restores_(restores),
      fetch_(std::move(fetch)),
      stage_(std::move(stage)),
      miss_ttl_(miss_ttl),
      clock_(clock) {}

Status RingFetch::Lookup(const std::string& session, const std::string& job,
                         const std::string& path, bool lease, FileInfo* out, uint64_t* lease_id,
                         std::vector<uint64_t>* unmap_buffer_ids,
                         Clock::TimePoint call_deadline, bool ask_ring,
                         const std::function<Status()>& admit, LoadFrom* from) {
  if (from) *from = LoadFrom::kCache;
  Status s = cache_->Lookup(session, job, path, lease, out, lease_id, unmap_buffer_ids);
  if (s.code() != Status::Code::kNotFound || !lease) return s;
  bool admitted = !admit;
  auto may_wait = [&]() {
    if (admitted) return Status::OK();
    Status a = admit();
    admitted = a.ok();
    return a;
  };
  if (restores_->InProgress(job)) {
    if (Status a = may_wait(); !a.ok()) return a;
    TCE_LOG(kDebug, "ring") << "a load of job=" << job << " path=" << path << " waits for the ring restore";
  }
  bool waited = false;  // the file may be on its way back from the ring
  Status restored = restores_->WaitFor(job, &waited, call_deadline);
  if (!restored.ok()) return restored;
  if (waited) {
    unmap_buffer_ids->clear();
    s = cache_->Lookup(session, job, path, lease, out, lease_id, unmap_buffer_ids);
    if (s.code() != Status::Code::kNotFound) return s;
  }
  if (!ask_ring || !ring_->MayBeInRing(job, path) || RecentlyMissed(job, path)) return s;
  if (Status a = may_wait(); !a.ok()) return a;
  LoadFrom fetched_from = LoadFrom::kPeer;
  bool shared = false;
  Status fetched = flights_.Do({job, path}, [&] { return fetch_(job, path, &fetched_from, call_deadline); },
                                &shared, nullptr, clock_, call_deadline);
  if (fetched.code() == Status::Code::kDeadlineExceeded && clock_->Now() >= call_deadline) return fetched;
  if (fetched.code() == Status::Code::kNotFound && !shared) NoteMiss(job, path);
  if (!fetched.ok() && fetched.code() != Status::Code::kFailedPrecondition) return s;
  if (fetched.ok() && !shared) {
    ++remote_reads_;
    if (from) *from = fetched_from;
  }
  unmap_buffer_ids->clear();
  return cache_->Lookup(session, job, path, lease, out, lease_id, unmap_buffer_ids);
}

Status RingFetch::StageForRanges(const std::string& job, const std::string& path, Clock::TimePoint call_deadline) {
  if (!stage_ || !ring_->MayBeInRing(job, path) || RecentlyMissed(job, path))
    return Status::NotFound(path + " is not read for the ring");
  bool shared = false;
  Status s = flights_.Do({job, path}, [&] { return stage_(job, path, call_deadline); }, &shared, nullptr, clock_,
                         call_deadline);
  if (s.code() == Status::Code::kNotFound && !shared) NoteMiss(job, path);
  return s;
}

bool RingFetch::RecentlyMissed(const std::string& job, const std::string& path) {
  MutexLock l(&mu_);
  auto it = misses_.find({job, path});
  if (it == misses_.end()) return false;
  if (clock_->Now() - it->second < miss_ttl_) return true;
  misses_.erase(it);
  return false;
}

void RingFetch::NoteMiss(const std::string& job, const std::string& path) {
  ++remote_misses_;
  MutexLock l(&mu_);
  if (misses_.size() >= kMaxRemembered) misses_.clear();  // bounded; forgetting only costs a fetch
  misses_[{job, path}] = clock_->Now();
}

}  // namespace tce
