#include "persist/persist_queue.h"

#include <gtest/gtest.h>

#include <thread>

namespace tce {
namespace {

using namespace std::chrono_literals;

TEST(PersistQueue, HandsOutFilesInCommitOrder) {
  PersistQueue q;
  q.Queue({"j", "/a"});
  q.Queue({"j", "/b"});
  EXPECT_EQ(q.Queued(), 2u);
  PersistQueue::Item item;
  ASSERT_TRUE(q.Next(&item));
  EXPECT_EQ(item.key.second, "/a");
  EXPECT_FALSE(item.retry);
  ASSERT_TRUE(q.Next(&item));
  EXPECT_EQ(item.key.second, "/b");
  EXPECT_EQ(q.Queued(), 0u);
}

TEST(PersistQueue, ARetryComesDueBehindWhatWasQueued) {
  PersistQueue q(30ms);
  const auto t0 = std::chrono::steady_clock::now();  // before the retry's due time is set
  EXPECT_EQ(q.RetryLater({"j", "/failed"}), 30ms);
  q.Queue({"j", "/new"});
  PersistQueue::Item item;
  ASSERT_TRUE(q.Next(&item));
  EXPECT_EQ(item.key.second, "/new");
  ASSERT_TRUE(q.Next(&item));  // blocks until the retry is due
  EXPECT_EQ(item.key.second, "/failed");
  EXPECT_TRUE(item.retry);
  EXPECT_GE(std::chrono::steady_clock::now() - t0, 30ms);
}

TEST(PersistQueue, ACancelledRetryNeverComes) {
  PersistQueue q(10ms);
  q.RetryLater({"j", "/x"});
  q.CancelRetry({"j", "/x"});
  std::thread stopper([&] {
    std::this_thread::sleep_for(100ms);
    q.Stop();
  });
  PersistQueue::Item item;
  EXPECT_FALSE(q.Next(&item));  // nothing came before Stop
  stopper.join();
}

TEST(PersistQueue, NoRetriesWithoutAnInterval) {
  PersistQueue q(0ms);
  EXPECT_EQ(q.RetryLater({"j", "/x"}), 0ms);
  q.Stop();
  PersistQueue::Item item;
  EXPECT_FALSE(q.Next(&item));
}

TEST(PersistQueue, StopWakesAWaitingWorker) {
  PersistQueue q;
  std::thread worker([&] {
    PersistQueue::Item item;
    EXPECT_FALSE(q.Next(&item));
  });
  std::this_thread::sleep_for(20ms);
  q.Stop();
  worker.join();
}

}  // namespace
}  // namespace tce
