// Persistence's own rules (cache/persistence.h), against a feed and a host
// that record what they are asked: one version of a file in flight at a
// time, the failures that may clear scheduled again on the feed, files
// queued only with storage roots, what was written counted by root, and the
// workers' and the retention's calls answered by the host. The Cache's side
// (the file table, pins, waits) is persister_test.cc's.
#include "cache/persistence.h"

#include <gtest/gtest.h>
#include <stdlib.h>

#include <filesystem>
#include <string>
#include <vector>

namespace tce {
namespace {

class FakeFeed : public PersistFeed {
 public:
  void Queue(const FileKey& key) override { calls.push_back("queue " + key.second); }
  std::chrono::milliseconds RetryLater(const FileKey& key) override {
    calls.push_back("retry " + key.second);
    return every;
  }
  void CancelRetry(const FileKey& key) override { calls.push_back("cancel " + key.second); }
  size_t Queued() const override { return queued; }

  std::vector<std::string> calls;
  std::chrono::milliseconds every{30000};
  size_t queued = 0;
};

// Records each call; PinCurrent answers `pin` with the key in the job.
class FakeHost : public PersistHost {
 public:
  bool PinCurrent(const FileKey& key, bool retry, PersistJob* out) override {
    calls.push_back(std::string(retry ? "pin retry " : "pin ") + key.second);
    out->job = key.first;
    out->path = key.second;
    return pin;
  }
  bool IsCurrent(const PersistJob& job) override {
    calls.push_back("current " + job.path);
    return true;
  }
  std::chrono::milliseconds WaitForNoSaves(std::chrono::milliseconds max) override {
    calls.push_back("wait " + std::to_string(max.count()));
    return std::chrono::milliseconds(7);
  }
  void Record(const PersistJob& job, const Status& result, std::vector<tce::Record> records,
              const FileStat&) override {
    calls.push_back("record " + job.path + " " + result.ToString() + " " + std::to_string(records.size()));
  }
  void StopPersistence() override { calls.push_back("stop"); }
  std::vector<TagInfo> CompleteTags(const std::string& job) override {
    calls.push_back("tags " + job);
    TagInfo t;
    t.job = job;
    t.tag = "step1";
    return {t};
  }
  void ForgetTag(const std::string& job, const std::string& tag) override {
    calls.push_back("forget " + job + " " + tag);
  }
  Requester JobRequester(const std::string& job) override {
    calls.push_back("requester " + job);
    return Requester();
  }

  std::vector<std::string> calls;
  bool pin = true;
};

class PersistenceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    for (std::string* dir : {&a_, &b_}) {
      char tmpl[] = "/tmp/tce-persistence-XXXXXX";
      ASSERT_NE(mkdtemp(tmpl), nullptr);
      *dir = tmpl;
    }
    roots_ = std::make_unique<StorageRoots>(std::vector<std::string>{a_, b_}, nullptr, PosixStoreOptions());
  }
  void TearDown() override {
    std::filesystem::remove_all(a_);
    std::filesystem::remove_all(b_);
  }

  std::string a_, b_;
  std::unique_ptr<StorageRoots> roots_;
  FakeFeed feed_;
  FakeHost host_;
};

TEST_F(PersistenceTest, OneVersionOfAFileIsInFlightAtATime) {
  Persistence p(&feed_, roots_.get(), &host_);
  const FileKey key{"job", a_ + "/x.pt"};
  ASSERT_TRUE(p.TakeOff(key, 3));
  EXPECT_FALSE(p.TakeOff(key, 3)) << "a second worker at the same version has nothing to do";
  EXPECT_TRUE(p.InFlight(key));
  EXPECT_TRUE(p.InFlightAt(key, 3));
  ASSERT_TRUE(p.TakeOff(key, 4)) << "a newer version goes";
  EXPECT_FALSE(p.InFlightAt(key, 3));
  p.Land(key, 3);  // the older write ends: the newer one stays in flight
  EXPECT_TRUE(p.InFlightAt(key, 4));
  EXPECT_TRUE(p.Busy());
  p.Land(key, 4);
  EXPECT_FALSE(p.InFlight(key));
  EXPECT_FALSE(p.Busy());
}

TEST_F(PersistenceTest, BacklogIsTheQueueAndTheFilesInFlight) {
  Persistence p(&feed_, roots_.get(), &host_);
  feed_.queued = 2;
  EXPECT_TRUE(p.Busy());
  ASSERT_TRUE(p.TakeOff({"job", a_ + "/x.pt"}, 1));
  ASSERT_TRUE(p.TakeOff({"job", b_ + "/y.pt"}, 1));
  EXPECT_EQ(p.Backlog(), 4u);
  feed_.queued = 0;
  EXPECT_EQ(p.Backlog(), 2u);
  EXPECT_EQ(Persistence(nullptr, roots_.get(), &host_).Backlog(), 0u);
}

TEST_F(PersistenceTest, OnlyFailuresThatMayClearAreTriedAgain) {
  Persistence p(&feed_, roots_.get(), &host_);
  const FileKey key{"job", a_ + "/x.pt"};
  for (const Status& s : {Status::ResourceExhausted("disk full"), Status::Internal("EIO"),
                          Status::Unavailable("no answer"), Status::DeadlineExceeded("slow")}) {
    EXPECT_EQ(p.ScheduleRetry(key, s), " (persisted again every 30.0 s while in memory)") << s.ToString();
  }
  EXPECT_EQ(feed_.calls.size(), 4u);
  feed_.calls.clear();
  for (const Status& s : {Status::PermissionDenied("not yours"), Status::FailedPrecondition("outside"),
                          Status::InvalidArgument("records")})
    EXPECT_EQ(p.ScheduleRetry(key, s), "") << s.ToString();
  EXPECT_TRUE(feed_.calls.empty()) << "a failure that cannot clear is never scheduled";
  feed_.every = std::chrono::milliseconds(0);  // the feed retries nothing by itself
  EXPECT_EQ(p.ScheduleRetry(key, Status::Internal("EIO")), "");
  EXPECT_EQ(Persistence(nullptr, roots_.get(), &host_).ScheduleRetry(key, Status::Internal("EIO")), "");
}

TEST_F(PersistenceTest, FilesAreQueuedOnlyWithStorageRoots) {
  Persistence p(&feed_, roots_.get(), &host_);
  p.Queue({"job", a_ + "/x.pt"});
  p.CancelRetry({"job", a_ + "/x.pt"});
  StorageRoots none;
  Persistence memory_only(&feed_, &none, &host_);
  memory_only.Queue({"job", "/elsewhere/y.pt"});
  EXPECT_EQ(feed_.calls, (std::vector<std::string>{"queue " + a_ + "/x.pt", "cancel " + a_ + "/x.pt"}));
  Persistence no_feed(nullptr, roots_.get(), &host_);
  no_feed.Queue({"job", a_ + "/x.pt"});  // nowhere: nothing to crash on
  no_feed.CancelRetry({"job", a_ + "/x.pt"});
}

TEST_F(PersistenceTest, WrittenFilesAreCountedByRoot) {
  Persistence p(&feed_, roots_.get(), &host_);
  p.CountWritten(a_ + "/x.pt", 100);
  p.CountWritten(a_ + "/sub/y.pt", 20);
  p.CountWritten(b_ + "/z.pt", 3);
  const PersistFigures f = p.Figures();
  EXPECT_EQ(f.files, 3u);
  EXPECT_EQ(f.bytes, 123u);
  ASSERT_EQ(f.by_root.size(), 2u);
  EXPECT_EQ(f.by_root.at(a_), std::make_pair(uint64_t{2}, uint64_t{120}));
  EXPECT_EQ(f.by_root.at(b_), std::make_pair(uint64_t{1}, uint64_t{3}));
}

TEST_F(PersistenceTest, WorkersAndRetentionAreAnsweredByTheHost) {
  Persistence p(&feed_, roots_.get(), &host_);
  PersistSource* source = &p;
  PersistJob job;
  EXPECT_TRUE(source->StartPersist({"job", "/x.pt"}, /*retry=*/true, &job));
  EXPECT_EQ(job.path, "/x.pt");
  host_.pin = false;
  EXPECT_FALSE(source->StartPersist({"job", "/y.pt"}, /*retry=*/false, &job));
  EXPECT_TRUE(source->IsCurrent(job));
  EXPECT_EQ(source->WaitForNoSaves(std::chrono::milliseconds(50)).count(), 7);
  source->FinishPersist(job, Status::Internal("EIO"), {Record()}, FileStat());
  EXPECT_EQ(source->ListTags("job").at(0).tag, "step1");
  source->ForgetTag("job", "step1");
  source->JobRequester("job");
  source->StopPersistence();
  EXPECT_EQ(host_.calls, (std::vector<std::string>{"pin retry /x.pt", "pin /y.pt", "current /y.pt", "wait 50",
                                                   "record /y.pt INTERNAL: EIO 1", "tags job", "forget job step1",
                                                   "requester job", "stop"}));
}

}  // namespace
}  // namespace tce
