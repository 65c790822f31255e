#include "common/log_limiter.h"

#include <gtest/gtest.h>

#include "common/manual_clock.h"

namespace tce {
namespace {

TEST(LogLimiter, LetsABurstThroughThenCountsWhatItDrops) {
  ManualClock clock;
  LogLimiter limiter(3, std::chrono::milliseconds(50), &clock);
  uint64_t dropped = 99;
  for (int i = 0; i < 3; ++i) {
    ASSERT_TRUE(limiter.Allow(&dropped));
    EXPECT_EQ(dropped, 0u);
  }
  for (int i = 0; i < 1000; ++i) EXPECT_FALSE(limiter.Allow(&dropped));
  clock.Advance(std::chrono::milliseconds(49));
  EXPECT_FALSE(limiter.Allow(&dropped));  // the same window
  clock.Advance(std::chrono::milliseconds(1));  // a new window
  ASSERT_TRUE(limiter.Allow(&dropped));
  EXPECT_EQ(dropped, 1001u);
  ASSERT_TRUE(limiter.Allow(&dropped));
  EXPECT_EQ(dropped, 0u);  // reported once
}

TEST(LogLimiter, SaysHowManyLinesWereSuppressed) {
  EXPECT_EQ(Suppressed(0), "");
  EXPECT_EQ(Suppressed(1), " (1 similar line suppressed)");
  EXPECT_EQ(Suppressed(1200), " (1200 similar lines suppressed)");
}

}  // namespace
}  // namespace tce
