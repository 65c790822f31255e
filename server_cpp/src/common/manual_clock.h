// ManualClock: a Clock for tests that moves only when the test says so.
//
//   ManualClock clock;
//   PersistQueue queue(..., &clock);
//   queue.Retry(key);                          // due in retry_interval
//   clock.Advance(retry_interval);             // now it is due
//
// Timed waits on it end once Advance has carried the clock past their
// deadline (they look at the clock every few real milliseconds, so a test
// never depends on the machine's speed: an unadvanced clock never times out).
// Part of the test library, not linked into the server.
#pragma once

#include <atomic>

#include "common/clock.h"

namespace tce {

class ManualClock final : public Clock {
 public:
  // Starts at an arbitrary steady time and the given wall time.
  explicit ManualClock(WallTime wall_start = WallTime(std::chrono::seconds(1700000000)));

  TimePoint Now() override;
  WallTime WallNow() override;
  // Returns once the clock has been advanced by `d`.
  void SleepFor(Duration d) override;
  bool WaitUntil(CondVar* cv, Mutex* mu, TimePoint deadline) override REQUIRES(mu);

  // Moves both clocks forward by `d`.
  void Advance(Duration d);
  // Timed waits and sleeps begun so far (a test waits for a thread to reach
  // its wait before advancing past the deadline it set).
  uint64_t waits() const { return waits_.load(); }

 private:
  const TimePoint steady_start_;
  const WallTime wall_start_;
  std::atomic<int64_t> offset_ns_{0};
  std::atomic<uint64_t> waits_{0};
};

}  // namespace tce
