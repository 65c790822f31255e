// Clock: every read of time the server makes, behind one interface, so the
// rules that depend on time (retries, backoff, idle timeouts, leases,
// restore waits, heartbeats) can be tested by moving a clock instead of
// sleeping. The product takes a Clock* wherever it has such a rule and reads
// time, sleeps and waits with a deadline only through it; Clock::Real() is
// the one implementation that touches the system's clocks. Tests use
// ManualClock (common/manual_clock.h), which moves only when told to.
// Implementations must be thread-safe.
#pragma once

#include <chrono>
#include <cstdint>

#include "common/mutex.h"

namespace tce {

class Clock {
 public:
  using TimePoint = std::chrono::steady_clock::time_point;
  using Duration = std::chrono::steady_clock::duration;
  using WallTime = std::chrono::system_clock::time_point;

  virtual ~Clock() = default;
  // The system's clocks (steady and wall), process-wide.
  static Clock* Real();

  // Monotonic time: for deadlines, intervals and durations.
  virtual TimePoint Now() = 0;
  // Wall-clock time: for what the metadata and logs record, and for the
  // deadlines gRPC keeps on that clock.
  virtual WallTime WallNow() = 0;
  // Blocks the calling thread for `d` of this clock's time.
  virtual void SleepFor(Duration d) = 0;
  // Waits on `cv` (with `mu` held) until it is signalled or this clock
  // reaches `deadline`; false once the deadline passed. May wake spuriously:
  // callers loop on their condition.
  virtual bool WaitUntil(CondVar* cv, Mutex* mu, TimePoint deadline) REQUIRES(mu) = 0;

  // Nanoseconds since the Unix epoch, now.
  int64_t UnixNowNs() {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(WallNow().time_since_epoch()).count();
  }
  // Milliseconds left until `deadline`, rounded up, so that a wait for them
  // never ends before it (0 once passed; `deadline` may be TimePoint::max(),
  // which leaves the most a duration holds).
  std::chrono::milliseconds Left(TimePoint deadline) {
    if (deadline == TimePoint::max()) return std::chrono::milliseconds::max();
    const auto now = Now();
    if (now >= deadline) return std::chrono::milliseconds(0);
    return std::chrono::ceil<std::chrono::milliseconds>(deadline - now);
  }

 protected:
  // The system's timed wait, for implementations.
  static bool SystemWaitUntil(CondVar* cv, Mutex* mu, std::chrono::steady_clock::time_point deadline)
      REQUIRES(mu) {
    return cv->WaitUntil(mu, deadline);
  }
};

// Measures the time between construction (or Restart) and Elapsed on a clock.
class Stopwatch {
 public:
  explicit Stopwatch(Clock* clock) : clock_(clock), start_(clock->Now()) {}
  void Restart() { start_ = clock_->Now(); }
  Clock::Duration Elapsed() const { return clock_->Now() - start_; }
  double Seconds() const { return std::chrono::duration<double>(Elapsed()).count(); }
  std::chrono::milliseconds Millis() const {
    return std::chrono::duration_cast<std::chrono::milliseconds>(Elapsed());
  }

 private:
  Clock* const clock_;
  Clock::TimePoint start_;
};

}  // namespace tce
