#include "ring/backup_queue.h"

#include <gtest/gtest.h>

#include <chrono>
#include <thread>

namespace tce {
namespace {

TEST(BackupQueue, DropsAndRecoveriesGoBeforeSendsEachInOrder) {
  BackupQueue q;
  q.Send({"j", "/a"});
  q.Drop(DropCopy{"j", "/old", "peer:1", 3});
  q.Send({"j", "/b"});
  q.Recover(RecoverJob{"j2", 1, "peer:2", "peer:0"});
  EXPECT_EQ(q.Waiting(), (std::vector<FileKey>{{"j", "/a"}, {"j", "/b"}}));  // files to send
  BackupQueue::Job job;
  ASSERT_TRUE(q.Next(&job));
  ASSERT_TRUE(std::holds_alternative<DropCopy>(job));
  EXPECT_EQ(std::get<DropCopy>(job).path, "/old");
  EXPECT_EQ(std::get<DropCopy>(job).version, 3u);
  ASSERT_TRUE(q.Next(&job));
  ASSERT_TRUE(std::holds_alternative<RecoverJob>(job));
  EXPECT_EQ(std::get<RecoverJob>(job).predecessor, "peer:0");
  ASSERT_TRUE(q.Next(&job));
  EXPECT_EQ(std::get<FileKey>(job).second, "/a");
  ASSERT_TRUE(q.Next(&job));
  EXPECT_EQ(std::get<FileKey>(job).second, "/b");
  EXPECT_TRUE(q.Waiting().empty());
}

TEST(BackupQueue, StopWakesAWaitingWorker) {
  BackupQueue q;
  std::thread worker([&] {
    BackupQueue::Job job;
    EXPECT_FALSE(q.Next(&job));
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  q.Stop();
  worker.join();
  q.Send({"j", "/late"});
  BackupQueue::Job job;
  EXPECT_FALSE(q.Next(&job));  // stopped for good
}

}  // namespace
}  // namespace tce
