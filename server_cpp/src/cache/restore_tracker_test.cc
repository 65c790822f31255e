#include "cache/restore_tracker.h"

#include <gtest/gtest.h>

#include <thread>

namespace tce {
namespace {

TEST(RestoreTracker, AJobNotBeingRestoredNeverWaits) {
  RestoreTracker t;
  const auto t0 = std::chrono::steady_clock::now();
  EXPECT_TRUE(t.Wait("j", std::chrono::seconds(10)).ok());
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(1));
}

TEST(RestoreTracker, AWaitEndsWhenTheRestoreEnds) {
  RestoreTracker t;
  t.Begin("j", "10.0.0.3:7070", 1);
  t.Begin("other", "10.0.0.3:7070", 1);
  EXPECT_TRUE(t.InProgress("j"));
  std::thread ender([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    t.End("j");
  });
  const auto t0 = std::chrono::steady_clock::now();
  Status s = t.Wait("j", std::chrono::seconds(20));
  ender.join();
  EXPECT_TRUE(s.ok()) << s.ToString();
  EXPECT_GE(std::chrono::steady_clock::now() - t0, std::chrono::milliseconds(90));
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(10));
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
  RestoreTracker t;
  t.Begin("j", "10.0.0.3:7070", 1);
  Status s = t.Wait("j", std::chrono::milliseconds(50));
  EXPECT_EQ(s.code(), Status::Code::kDeadlineExceeded);
  EXPECT_NE(s.message().find("ring restore of job j"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("node 1's files"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("10.0.0.3:7070"), std::string::npos) << s.message();
}

}  // namespace
}  // namespace tce
