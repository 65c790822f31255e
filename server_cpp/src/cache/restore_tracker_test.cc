#include "cache/restore_tracker.h"

#include <gtest/gtest.h>

#include <thread>

#include "common/manual_clock.h"
#include "common/testing.h"

namespace tce {
namespace {

TEST(RestoreTracker, AJobNotBeingRestoredNeverWaits) {
  ManualClock clock;  // never advanced: any wait would last forever
  RestoreTracker t(&clock);
  bool waited = true;
  EXPECT_TRUE(t.Wait("j", std::chrono::seconds(10), &waited).ok());
  EXPECT_FALSE(waited);
  EXPECT_EQ(clock.waits(), 0u);
}

TEST(RestoreTracker, AWaitEndsWhenTheRestoreEnds) {
  ManualClock clock;  // never advanced: only End ends the wait
  RestoreTracker t(&clock);
  t.Begin("j", "10.0.0.3:7070", 1);
  t.Begin("other", "10.0.0.3:7070", 1);
  EXPECT_TRUE(t.InProgress("j"));
  Status s = Status::Internal("not yet");
  bool waited = false;
  std::thread waiter([&] { s = t.Wait("j", std::chrono::seconds(20), &waited); });
  ASSERT_TRUE(Eventually([&] { return clock.waits() > 0; }));  // it waits
  t.End("j");
  waiter.join();
  EXPECT_TRUE(s.ok()) << s.ToString();
  EXPECT_TRUE(waited);
  EXPECT_FALSE(t.InProgress("j"));
  EXPECT_TRUE(t.InProgress("other"));  // only that job's restore ended
}

TEST(RestoreTracker, StoppingEndsEveryWaitAndRefusesTheNextOnes) {
  RestoreTracker t;
  t.Begin("j", "10.0.0.3:7070", 1);
  Status waited;
  std::thread waiter([&] { waited = t.Wait("j", std::chrono::minutes(10)); });
  t.StopWaits();  // whether the waiter is waiting yet or not
  waiter.join();
  EXPECT_EQ(waited.code(), Status::Code::kUnavailable) << waited.ToString();
  EXPECT_NE(waited.message().find("the server is stopping"), std::string::npos) << waited.message();
  EXPECT_EQ(t.Wait("j", std::chrono::minutes(10)).code(), Status::Code::kUnavailable);
  EXPECT_TRUE(t.InProgress("j"));  // the restore itself goes on
  EXPECT_TRUE(t.Wait("other", std::chrono::minutes(10)).ok());  // nothing to wait for
}

TEST(RestoreTracker, AWaitTimesOutNamingWhatItWaitedFor) {
  ManualClock clock;
  RestoreTracker t(&clock);
  t.Begin("j", "10.0.0.3:7070", 1);
  clock.Advance(std::chrono::milliseconds(700));  // the restore has been running for a while
  Status s = Status::OK();
  std::thread waiter([&] { s = t.Wait("j", std::chrono::milliseconds(50)); });
  ASSERT_TRUE(Eventually([&] { return clock.waits() > 0; }));
  clock.Advance(std::chrono::milliseconds(50));
  waiter.join();
  EXPECT_EQ(s.code(), Status::Code::kDeadlineExceeded);
  EXPECT_EQ(s.message(),
            "waited 50 ms (ring_restore_wait_ms) for the ring restore of job j: node 1's files are still "
            "being pulled back from 10.0.0.3:7070 (running for 750 ms; tce status shows the ring's last error)");
}

}  // namespace
}  // namespace tce
