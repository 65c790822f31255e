// LogLimiter: at most one log line per interval for an event that an
// attacker or a broken environment can repeat at will (refused connections,
// accept errors). The line that is let through says how many were held back.
// Thread-safe.
#pragma once

#include <chrono>
#include <cstdint>
#include <mutex>

namespace tce {

class LogLimiter {
 public:
  explicit LogLimiter(std::chrono::milliseconds interval = std::chrono::seconds(1))
      : interval_(interval) {}

  // True when this occurrence may be logged; then *suppressed is how many
  // occurrences since the last logged one were not.
  bool Allow(uint64_t* suppressed) {
    std::lock_guard<std::mutex> l(mu_);
    const auto now = std::chrono::steady_clock::now();
    if (logged_once_ && now - last_ < interval_) {
      ++held_;
      return false;
    }
    logged_once_ = true;
    last_ = now;
    *suppressed = held_;
    held_ = 0;
    return true;
  }

 private:
  const std::chrono::milliseconds interval_;
  std::mutex mu_;
  bool logged_once_ = false;                    // GUARDED_BY(mu_)
  std::chrono::steady_clock::time_point last_;  // GUARDED_BY(mu_)
  uint64_t held_ = 0;                           // GUARDED_BY(mu_)
};

}  // namespace tce
