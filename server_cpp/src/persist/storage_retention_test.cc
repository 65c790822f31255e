#include "persist/storage_retention.h"

#include <gtest/gtest.h>

#include <unistd.h>

#include <string>
#include <thread>
#include <utility>

#include "cache/cache.h"

namespace tce {
namespace {

TEST(RetentionQueue, QueuesEachJobOnceInOrder) {
  RetentionQueue q(/*enabled=*/true);
  q.TagComplete("a");
  q.TagComplete("b");
  q.TagComplete("a");
  std::string job;
  ASSERT_TRUE(q.Take(&job));
  EXPECT_EQ(job, "a");
  ASSERT_TRUE(q.Take(&job));
  EXPECT_EQ(job, "b");
  q.TagComplete("a");  // taken already: queued again
  ASSERT_TRUE(q.Take(&job));
  EXPECT_EQ(job, "a");
}

TEST(RetentionQueue, HoldsAtMostKMaxJobs) {
  RetentionQueue q(true);
  for (size_t i = 0; i < RetentionQueue::kMax + 10; ++i) q.TagComplete("job" + std::to_string(i));
  std::string job;
  for (size_t i = 0; i < RetentionQueue::kMax; ++i) ASSERT_TRUE(q.Take(&job));
  EXPECT_EQ(job, "job" + std::to_string(RetentionQueue::kMax - 1));
  q.Stop();
  EXPECT_FALSE(q.Take(&job));  // the 10 beyond kMax were never queued
}

TEST(RetentionQueue, DisabledQueuesNothingAndStopEndsAWait) {
  RetentionQueue q(/*enabled=*/false);
  q.TagComplete("a");
  bool took = true;
  std::thread waiter([&] {
    std::string job;
    took = q.Take(&job);
  });
  q.Stop();
  waiter.join();
  EXPECT_FALSE(took);
}

// The Cache tells its TagFeed the job of each tag recorded complete, and
// nothing for a tag it refuses.
TEST(RetentionQueue, TheCacheFeedsItEachCompleteTag) {
  RetentionQueue q(true);
  CacheOptions o(1 << 20);
  o.tag_feed = &q;
  Cache cache(std::move(o));
  const std::string session = cache.sessions()->OpenSession(getuid(), getpid());
  AllocateResult a;
  ASSERT_TRUE(cache.Allocate(AllocateRequest{session, "job", "t1", "/ckpt/t1/x.pt", 0, 16}, &a).ok());
  FileInfo f;
  ASSERT_TRUE(cache.Commit(session, a.allocation_id, {}, &f).ok());
  TagInfo tag;
  tag.job = "job";
  tag.tag = "t1";
  tag.world_size = 1;
  tag.files.push_back(TagFile{0, "/ckpt/t1/x.pt", 16});
  TagInfo out;
  ASSERT_TRUE(cache.CommitTag(session, tag, &out).ok());
  std::string job;
  ASSERT_TRUE(q.Take(&job));
  EXPECT_EQ(job, "job");
  TagInfo missing = tag;
  missing.job = "other";
  missing.tag = "t2";
  missing.files[0].path = "/ckpt/t2/none.pt";
  EXPECT_FALSE(cache.CommitTag(session, missing, &out).ok());
  q.TagComplete("next");  // the refused tag queued nothing before it
  ASSERT_TRUE(q.Take(&job));
  EXPECT_EQ(job, "next");
}

}  // namespace
}  // namespace tce
