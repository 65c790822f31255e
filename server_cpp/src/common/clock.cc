#include "common/clock.h"

#include <thread>

namespace tce {
namespace {

class RealClock final : public Clock {
 public:
  TimePoint Now() override { return std::chrono::steady_clock::now(); }
  WallTime WallNow() override { return std::chrono::system_clock::now(); }
  void SleepFor(Duration d) override { std::this_thread::sleep_for(d); }
  bool WaitUntil(CondVar* cv, Mutex* mu, TimePoint deadline) override REQUIRES(mu) {
    return SystemWaitUntil(cv, mu, deadline);
  }
};

}  // namespace

Clock* Clock::Real() {
  static RealClock clock;
  return &clock;
}

}  // namespace tce
