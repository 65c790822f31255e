// LogLimiter: keeps a flood of one kind of log line (a refused connection,
// a failing accept) from filling the disk. At most `burst` lines pass per
// `interval`; the first line let through after some were dropped says how
// many. Thread-safe.
//
//   static LogLimiter limiter(5, std::chrono::seconds(10));
//   uint64_t dropped = 0;
//   if (limiter.Allow(&dropped)) TCE_LOG(kWarning, "x") << "..." << Suppressed(dropped);
#pragma once

#include <chrono>
#include <cstdint>
#include <string>

#include "common/clock.h"
#include "common/mutex.h"

namespace tce {

class LogLimiter {
 public:
  LogLimiter(int burst, std::chrono::milliseconds interval, Clock* clock = Clock::Real())
      : burst_(burst), interval_(interval), clock_(clock) {}

  // Whether a line may be logged now. When it may, `*suppressed` is the
  // number of lines refused since the last one allowed (and is reset).
  bool Allow(uint64_t* suppressed);

 private:
  const int burst_;
  const std::chrono::milliseconds interval_;
  Clock* const clock_;
  Mutex mu_;
  Clock::TimePoint window_start_ GUARDED_BY(mu_);
  int in_window_ GUARDED_BY(mu_) = 0;
  uint64_t suppressed_ GUARDED_BY(mu_) = 0;
};

// " (N similar lines suppressed)", or "" for 0: to append to an allowed line.
std::string Suppressed(uint64_t n);

}  // namespace tce
