#include "common/manual_clock.h"

#include <thread>

namespace tce {

ManualClock::ManualClock(WallTime wall_start)
    : steady_start_(TimePoint(std::chrono::hours(1000))), wall_start_(wall_start) {}

Clock::TimePoint ManualClock::Now() {
  return steady_start_ + std::chrono::nanoseconds(offset_ns_.load());
}

Clock::WallTime ManualClock::WallNow() {
  return wall_start_ + std::chrono::duration_cast<WallTime::duration>(std::chrono::nanoseconds(offset_ns_.load()));
}

void ManualClock::SleepFor(Duration d) {
  waits_++;
  const TimePoint until = Now() + d;
  while (Now() < until) std::this_thread::sleep_for(std::chrono::milliseconds(1));
}

bool ManualClock::WaitUntil(CondVar* cv, Mutex* mu, TimePoint deadline) {
  waits_++;
  if (Now() >= deadline) return false;
  // A short real wait, then the caller looks at its condition (and at this
  // clock) again: a signal ends it at once, Advance within a few ms.
  SystemWaitUntil(cv, mu, std::chrono::steady_clock::now() + std::chrono::milliseconds(2));
  return true;
}

void ManualClock::Advance(Duration d) {
  offset_ns_ += std::chrono::duration_cast<std::chrono::nanoseconds>(d).count();
}

}  // namespace tce
