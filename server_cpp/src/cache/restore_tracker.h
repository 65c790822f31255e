// RestoreTracker: the jobs whose files this server is pulling back from the
// ring (a fresh or restarted node), so a load can wait for the restore
// instead of missing files that arrive moments later.
//
// A restore begins when the Cache queues a job's recovery and ends when the
// Replicator has pulled what the successor holds (whatever it got), or has
// failed a few times in a row (the successor may be gone: the restore goes
// on in the background, loads no longer wait). Loads (rpc/service.h,
// ring/ring_fetch.h) ask it directly: it is a component beside the Cache,
// made by the daemon (or by the Cache when none is given) and shared.
// Waits are bounded by the restore wait or the timeout their caller gives.
//
// Thread-safe (its own mutex, a leaf: nothing is called while it is held).
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <string>

#include "common/clock.h"
#include "common/mutex.h"
#include "common/status.h"

namespace tce {

class RestoreTracker {
 public:
  // Waits are measured on `clock`; WaitFor waits up to `restore_wait`
  // (ring_restore_wait_ms).
  explicit RestoreTracker(Clock* clock = Clock::Real(),
                          std::chrono::milliseconds restore_wait = std::chrono::seconds(120))
      : clock_(clock), restore_wait_(restore_wait) {}

  // The job's files are being pulled from `peer` (node `node_rank`'s copies).
  void Begin(const std::string& job, const std::string& peer, int32_t node_rank);
  // The restore of `job` ended; wakes its waiters.
  // `from` non-empty: only a restore from that peer ends (a newer one from
  // another peer goes on).
  void End(const std::string& job, const std::string& from = "");
  // OK at once when `job` is not being restored; else waits up to `timeout`
  // for the restore to end: DEADLINE_EXCEEDED (naming the job, the peer, how
  // long it waited and `bound`, what set the timeout) if it does not.
  // *waited (optional): whether it did.
  Status Wait(const std::string& job, std::chrono::milliseconds timeout, bool* waited = nullptr,
              const std::string& bound = "ring_restore_wait_ms");
  // Wait for a load: up to the restore wait, or until `call_deadline`, the
  // caller's own deadline, when that is sooner (the answer then comes before
  // the caller gives up, and says so).
  Status WaitFor(const std::string& job, bool* waited, Clock::TimePoint call_deadline);
  bool InProgress(const std::string& job) const;
  // The server stops: every wait ends now, and later ones at once
  // (UNAVAILABLE), though the restores may go on.
  void StopWaits();

 private:
  struct Restore {
    std::string peer;
    int32_t node_rank = 0;
    Clock::TimePoint since;
  };
  Clock* const clock_;
  const std::chrono::milliseconds restore_wait_;
  mutable Mutex mu_;
  CondVar ended_;
  std::map<std::string, Restore> restores_ GUARDED_BY(mu_);  // by job
  bool stopping_ GUARDED_BY(mu_) = false;
};

}  // namespace tce
