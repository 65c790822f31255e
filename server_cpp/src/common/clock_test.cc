#include "common/clock.h"

#include <gtest/gtest.h>

#include <atomic>
#include <thread>

#include "common/manual_clock.h"
#include "common/testing.h"

namespace tce {
namespace {

using namespace std::chrono_literals;

TEST(Clock, WhatIsLeftIsRoundedUpSoAWaitNeverEndsEarly) {
  ManualClock clock;
  const auto deadline = clock.Now() + 800ms;
  EXPECT_EQ(clock.Left(deadline), 800ms);
  clock.Advance(799ms + 800us);
  EXPECT_EQ(clock.Left(deadline), 1ms);  // 0.2 ms left: not yet 0
  clock.Advance(200us);
  EXPECT_EQ(clock.Left(deadline), 0ms);
  clock.Advance(1h);
  EXPECT_EQ(clock.Left(deadline), 0ms);
  EXPECT_EQ(clock.Left(Clock::TimePoint::max()), std::chrono::milliseconds::max());
}

TEST(Clock, AStopwatchMeasuresOnItsClock) {
  ManualClock clock;
  Stopwatch watch(&clock);
  clock.Advance(1500ms);
  EXPECT_EQ(watch.Millis(), 1500ms);
  EXPECT_DOUBLE_EQ(watch.Seconds(), 1.5);
  watch.Restart();
  EXPECT_EQ(watch.Millis(), 0ms);
}

TEST(ManualClock, WallTimeMovesWithTheSteadyTime) {
  ManualClock clock(Clock::WallTime(std::chrono::seconds(1000)));
  EXPECT_EQ(clock.UnixNowNs(), 1000 * int64_t{1000000000});
  clock.Advance(2500ms);
  EXPECT_EQ(clock.UnixNowNs(), 1002500 * int64_t{1000000});
}

TEST(ManualClock, ATimedWaitEndsOnlyOnceTheClockIsAdvancedPastItsDeadline) {
  ManualClock clock;
  Mutex mu;
  CondVar cv;
  std::atomic<bool> timed_out{false};
  const auto deadline = clock.Now() + 10s;
  std::thread waiter([&] {
    MutexLock l(&mu);
    while (clock.WaitUntil(&cv, &mu, deadline)) {
    }
    timed_out = true;
  });
  ASSERT_TRUE(Eventually([&] { return clock.waits() > 0; }));
  clock.Advance(9999ms);
  const uint64_t looked = clock.waits();
  ASSERT_TRUE(Eventually([&] { return clock.waits() > looked + 1; }));  // it looked after the advance
  EXPECT_FALSE(timed_out);
  clock.Advance(1ms);
  waiter.join();
  EXPECT_TRUE(timed_out);
}

TEST(ManualClock, ASignalEndsAWaitWithoutMovingTheClock) {
  ManualClock clock;
  Mutex mu;
  CondVar cv;
  bool ready = false;
  std::thread waiter([&] {
    MutexLock l(&mu);
    while (!ready && clock.WaitUntil(&cv, &mu, clock.Now() + 1h)) {
    }
    EXPECT_TRUE(ready);  // woken, not timed out
  });
  ASSERT_TRUE(Eventually([&] { return clock.waits() > 0; }));
  {
    MutexLock l(&mu);
    ready = true;
  }
  cv.SignalAll();
  waiter.join();
}

TEST(ManualClock, SleepReturnsOnceTheClockHasMovedThatFar) {
  ManualClock clock;
  std::atomic<bool> woke{false};
  std::thread sleeper([&] {
    clock.SleepFor(5s);
    woke = true;
  });
  ASSERT_TRUE(Eventually([&] { return clock.waits() > 0; }));
  clock.Advance(4s);
  EXPECT_FALSE(woke);
  clock.Advance(1s);
  sleeper.join();
  EXPECT_TRUE(woke);
}

}  // namespace
}  // namespace tce
