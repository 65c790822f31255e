#include "common/log_limiter.h"

namespace tce {

bool LogLimiter::Allow(uint64_t* suppressed) {
  MutexLock lock(&mu_);
  const auto now = clock_->Now();
  if (in_window_ == 0 || now - window_start_ >= interval_) {
    window_start_ = now;
    in_window_ = 0;
  }
  if (in_window_ >= burst_) {
    ++suppressed_;
    return false;
  }
  ++in_window_;
  *suppressed = suppressed_;
  suppressed_ = 0;
  return true;
}

std::string Suppressed(uint64_t n) {
  if (n == 0) return "";
  return " (" + std::to_string(n) + " similar line" + (n == 1 ? "" : "s") + " suppressed)";
}

}  // namespace tce
