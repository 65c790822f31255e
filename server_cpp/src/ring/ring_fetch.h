// RingFetch: the ring's part of a load. A load that misses the cache may find
// the file in the ring (this node's own copy at its successor, or another
// node's, for a rank that moved here): RingFetch asks the peers (`fetch`, the
// Replicator's FetchForLoad), then looks the cache up again. It sees the
// Cache twice: as the client's store it extends (`cache`: the lookup, the
// restore wait) and through the job's ring (`ring`, the Cache's Rings:
// whether to ask the ring).
//
// Policy: only leased lookups (loads) ask the ring, and only for files the
// cache says may be there (RingMembers::MayBeInRing). A file no peer held is
// remembered for `miss_ttl`: a load of it within that time goes to storage
// without asking again, so a job that probes for files it never saved does
// not cost a round of connections each (at most 4096 misses are remembered;
// forgetting one only costs a fetch). Thread-safe.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "cache/client_store.h"
#include "cache/ring_members.h"
#include "common/clock.h"
#include "common/mutex.h"
#include "common/single_flight.h"
#include "common/status.h"

namespace tce {

class RingFetch {
 public:
  // Brings (job, path) into the cache from the ring (or, by the restore
  // plan, from storage); `from` gets where its bytes came from. No wait on
  // a peer lasts past `deadline` (DEADLINE_EXCEEDED).
  using Fetch = std::function<Status(const std::string& job, const std::string& path, LoadFrom* from,
                                     Clock::TimePoint deadline)>;
  // Has (job, path) read from storage into the memory of the node the
  // restore plan names, for ranged reads (Replicator::LoadByPlan, `stage`).
  using Stage = std::function<Status(const std::string& job, const std::string& path, Clock::TimePoint deadline)>;

  RingFetch(ClientStore* cache, RingMembers* ring, RestoreTracker* restores, Fetch fetch, Stage stage = nullptr,
            std::chrono::milliseconds miss_ttl = std::chrono::seconds(5), Clock* clock = Clock::Real());

  // ClientStore::Lookup; on a miss while the job's files are being restored
  // from the ring, waits for the restore (RestoreTracker::WaitFor: bounded, and
  // DEADLINE_EXCEEDED naming it) and looks again; then the ring as above. A fetch that found the
  // file (OK), or found a newer save already here (FAILED_PRECONDITION),
  // is followed by a second lookup, whose answer is returned.
  // `call_deadline`: the caller's, which bounds the restore wait, the waits
  // on peers and the wait for another load's fetch of the file too (then
  // DEADLINE_EXCEEDED, naming what it waited for).
  // Without `ask_ring`, a miss after the restore wait is the answer (the
  // caller reads ranges instead of pulling the whole file).
  // `admit` (optional): asked once before the lookup waits on the ring (a
  // restore in flight, or a fetch); its failure is the answer, as a peer
  // that never answers would hold the caller's thread.
  // `from` (optional): where the file's bytes came from for this lookup
  // (kCache: in memory here already, or brought by another load).
  // Loads of one file at once share one fetch.
  Status Lookup(const std::string& session, const std::string& job, const std::string& path,
                bool lease, FileInfo* out, uint64_t* lease_id,
                std::vector<uint64_t>* unmap_buffer_ids,
                Clock::TimePoint call_deadline = Clock::TimePoint::max(),
                bool ask_ring = true, const std::function<Status()>& admit = nullptr, LoadFrom* from = nullptr);
  // A ranged read missed (job, path) everywhere: has the restore plan's
  // node read it from storage (OK: read the ranges again). NOT_FOUND when
  // the ring cannot (no ring, not under storage, recently missed);
  // DEADLINE_EXCEEDED as Lookup's.
  Status StageForRanges(const std::string& job, const std::string& path,
                        Clock::TimePoint call_deadline = Clock::TimePoint::max());

  uint64_t remote_reads() const { return remote_reads_.load(); }    // files the ring gave
  uint64_t remote_misses() const { return remote_misses_.load(); }  // fetches no peer answered

 private:
  bool RecentlyMissed(const std::string& job, const std::string& path);
  void NoteMiss(const std::string& job, const std::string& path);

  ClientStore* const cache_;
  RingMembers* const ring_;
  RestoreTracker* const restores_;
  const Fetch fetch_;
  const Stage stage_;
  const std::chrono::milliseconds miss_ttl_;
  Clock* const clock_;
  std::atomic<uint64_t> remote_reads_{0};
  std::atomic<uint64_t> remote_misses_{0};
  Mutex mu_;
  std::map<std::pair<std::string, std::string>, Clock::TimePoint> misses_ GUARDED_BY(mu_);
  SingleFlight<std::pair<std::string, std::string>> flights_;  // one fetch of a file at a time
};

}  // namespace tce
