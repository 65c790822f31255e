#include "persist/persist_queue.h"

#include <gtest/gtest.h>

#include <atomic>
#include <thread>

#include "common/manual_clock.h"
#include "common/testing.h"

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
  ManualClock clock;
  PersistQueue q(30ms, &clock);
  EXPECT_EQ(q.RetryLater({"j", "/failed"}), 30ms);
  q.Queue({"j", "/new"});
  PersistQueue::Item item;
  ASSERT_TRUE(q.Next(&item));
  EXPECT_EQ(item.key.second, "/new");
  std::atomic<bool> got{false};
  std::thread worker([&] {
    ASSERT_TRUE(q.Next(&item));  // blocks until the retry is due
    got = true;
  });
  ASSERT_TRUE(Eventually([&] { return clock.waits() >= 1; }));
  clock.Advance(29ms);
  const uint64_t looked = clock.waits();
  ASSERT_TRUE(Eventually([&] { return clock.waits() > looked + 1; }));  // it looked again, after the advance
  EXPECT_FALSE(got);  // not due yet
  clock.Advance(1ms);
  worker.join();
  EXPECT_EQ(item.key.second, "/failed");
  EXPECT_TRUE(item.retry);
}

TEST(PersistQueue, ACancelledRetryNeverComes) {
  ManualClock clock;
  PersistQueue q(10ms, &clock);
  q.RetryLater({"j", "/x"});
  q.CancelRetry({"j", "/x"});
  clock.Advance(1h);
  q.Queue({"j", "/other"});
  PersistQueue::Item item;
  ASSERT_TRUE(q.Next(&item));  // a due retry would have joined the queue now
  EXPECT_EQ(item.key.second, "/other");
  EXPECT_EQ(q.Queued(), 0u);
}

TEST(PersistQueue, NoRetriesWithoutAnInterval) {
  PersistQueue q(0ms);
  EXPECT_EQ(q.RetryLater({"j", "/x"}), 0ms);
  q.Stop();
  PersistQueue::Item item;
  EXPECT_FALSE(q.Next(&item));
}

TEST(PersistQueue, EachLaneHandsOutOnlyItsOwnFiles) {
  ManualClock clock;
  // Lane 1: the files under /s3; lane 0: the rest.
  PersistQueue q(30ms, &clock, 2, [](const FileKey& k) -> size_t { return k.second.rfind("/s3/", 0) == 0 ? 1 : 0; });
  q.Queue({"j", "/s3/a"});
  q.Queue({"j", "/s3/b"});
  q.Queue({"j", "/disk/c"});
  PersistQueue::Item item;
  ASSERT_TRUE(q.Next(&item, 0));  // not behind the object root's files
  EXPECT_EQ(item.key.second, "/disk/c");
  q.RetryLater({"j", "/disk/failed"});
  std::atomic<bool> got{false};
  std::thread disk([&] {
    PersistQueue::Item retried;
    ASSERT_TRUE(q.Next(&retried, 0));
    EXPECT_EQ(retried.key.second, "/disk/failed");
    EXPECT_TRUE(retried.retry);
    got = true;
  });
  ASSERT_TRUE(Eventually([&] { return clock.waits() >= 1; }));
  EXPECT_FALSE(got);  // lane 0 holds no other file: it waits for the retry
  ASSERT_TRUE(q.Next(&item, 1));
  EXPECT_EQ(item.key.second, "/s3/a");
  clock.Advance(30ms);
  disk.join();
  ASSERT_TRUE(q.Next(&item, 1));
  EXPECT_EQ(item.key.second, "/s3/b");
  EXPECT_EQ(q.Queued(), 0u);
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
