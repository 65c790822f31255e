#include "ring/prefetch_queue.h"

#include <gtest/gtest.h>

#include <thread>

namespace tce {
namespace {

PrefetchJob Job(const std::string& job, const std::string& dir) {
  PrefetchJob p;
  p.job = job;
  p.dir = dir;
  return p;
}

TEST(PrefetchQueue, EachUidHasItsShareAndTheSameOneIsQueuedOnce) {
  PrefetchQueue q;
  for (size_t i = 0; i < PrefetchQueue::kPerUid; ++i) EXPECT_TRUE(q.Add(1001, Job("a", "/d" + std::to_string(i))));
  EXPECT_FALSE(q.Add(1001, Job("a", "/more")));  // its share is full
  EXPECT_TRUE(q.Add(1002, Job("b", "/d0")));      // another uid's is not
  EXPECT_FALSE(q.Add(1002, Job("b", "/d0")));     // queued already
  uid_t uid = 0;
  PrefetchJob p;
  ASSERT_TRUE(q.Take(&uid, &p));
  EXPECT_EQ(uid, 1001u);
  EXPECT_FALSE(q.Add(1001, Job("a", "/d0")));  // running: the same one again is refused
  q.Done(uid, &p, /*finished=*/true);
  EXPECT_TRUE(q.Add(1001, Job("a", "/d0")));  // finished: room for one more
}

TEST(PrefetchQueue, AllUidsTogetherHoldAtMostTheQueue) {
  PrefetchQueue q;
  size_t added = 0;
  for (uid_t uid = 1000; uid < 1100; ++uid)
    for (size_t i = 0; i < PrefetchQueue::kPerUid; ++i)
      added += q.Add(uid, Job("j" + std::to_string(uid), "/d" + std::to_string(i)));
  EXPECT_EQ(added, PrefetchQueue::kMax);
}

TEST(PrefetchQueue, UidsTakeTurnsAStepAtATimeAndOneUidNeverRunsTwoSteps) {
  PrefetchQueue q;
  for (int i = 0; i < 3; ++i) EXPECT_TRUE(q.Add(1001, Job("a", "/d" + std::to_string(i))));
  EXPECT_TRUE(q.Add(1002, Job("b", "/d")));
  uid_t first = 0, second = 0;
  PrefetchJob a, b;
  ASSERT_TRUE(q.Take(&first, &a));
  ASSERT_TRUE(q.Take(&second, &b));  // 1001 has a step running: 1002's turn
  EXPECT_EQ(first, 1001u);
  EXPECT_EQ(second, 1002u);
  EXPECT_EQ(a.dir, "/d0");
  a.next = 5;  // a step of a's first prefetch, not finished
  q.Done(first, &a, /*finished=*/false);
  q.Done(second, &b, /*finished=*/false);
  uid_t uid = 0;
  PrefetchJob p;
  ASSERT_TRUE(q.Take(&uid, &p));  // in turn: 1001's unfinished prefetch, where it stopped
  EXPECT_EQ(uid, 1001u);
  EXPECT_EQ(p.dir, "/d0");
  EXPECT_EQ(p.next, 5u);
  q.Done(uid, &p, /*finished=*/true);
  ASSERT_TRUE(q.Take(&uid, &p));
  EXPECT_EQ(uid, 1002u);  // then 1002's, before 1001's others
  q.Done(uid, &p, /*finished=*/true);
  ASSERT_TRUE(q.Take(&uid, &p));
  EXPECT_EQ(uid, 1001u);
  EXPECT_EQ(p.dir, "/d1");
}

TEST(PrefetchQueue, StopEndsTakeAndRefusesAdd) {
  PrefetchQueue q;
  bool taken = true;
  std::thread worker([&] {
    uid_t uid = 0;
    PrefetchJob p;
    taken = q.Take(&uid, &p);  // waits: nothing queued
  });
  q.Stop();
  worker.join();
  EXPECT_FALSE(taken);
  EXPECT_FALSE(q.Add(1001, Job("a", "/d")));
  EXPECT_TRUE(q.stopped());
}

}  // namespace
}  // namespace tce
