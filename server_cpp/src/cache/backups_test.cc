// Backups' own rules (cache/backups.h), against a feed and a host that
// record what they are asked: the figures (in flight, backed up, failures,
// the last error, the run of failures), the run of failures logged as an
// error at most once a minute of the Cache's clock, the feed's work passed
// on (nothing without a feed), and the workers' calls answered by the host.
// The Cache's side (the file table, pins, holders) is covered by the ring's
// gtests and tests/test_ring.py.
#include "cache/backups.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "common/manual_clock.h"

namespace tce {
namespace {

class FakeFeed : public BackupFeed {
 public:
  void Send(const FileKey& key) override { calls.push_back("send " + key.second); }
  void SendTag(TagCopy tag) override { calls.push_back("tag " + tag.tag); }
  void Drop(DropCopy drop) override { calls.push_back("drop " + drop.path + "@" + drop.peer); }
  void Persisted(PersistedCopy copy) override { calls.push_back("persisted " + copy.path + "@" + copy.peer); }
  void Recover(RecoverJob recover) override { calls.push_back("recover " + recover.job); }
  std::vector<FileKey> Waiting() const override { return waiting; }

  std::vector<std::string> calls;
  std::vector<FileKey> waiting;
};

// Records each call; PinForBackup answers `pin`.
class FakeHost : public BackupHost {
 public:
  bool PinForBackup(const FileKey& key, BackupJob* out) override {
    calls.push_back("pin " + key.second);
    out->job = key.first;
    out->path = key.second;
    out->peer = "next:1";
    return pin;
  }
  void RecordBackup(const BackupJob& job, const Status& result) override {
    calls.push_back("record " + job.path + " " + result.ToString());
  }
  bool TagToSend(const TagCopy& copy, TagInfo* tag, std::string* peer, int32_t* node) override {
    calls.push_back("tag " + copy.tag);
    tag->tag = copy.tag;
    *peer = "next:1";
    *node = 2;
    return true;
  }
  size_t ForgetHolder(const std::string& job, const std::string& peer) override {
    calls.push_back("forget " + job + " " + peer);
    return 4;
  }

  std::vector<std::string> calls;
  bool pin = true;
};

FileInfo Held(const std::string& path, const std::string& holder) {
  FileInfo f;
  f.job = "j";
  f.path = path;
  f.backup_holder = holder;
  f.version = 3;
  return f;
}

TEST(BackupsTest, FiguresFollowEachBackupAndItsOutcome) {
  FakeFeed feed;
  FakeHost host;
  Backups b(&feed, &host);
  BackupJob one, two;
  ASSERT_TRUE(b.StartBackup({"j", "/a"}, &one));
  ASSERT_TRUE(b.StartBackup({"j", "/b"}, &two));
  EXPECT_EQ(b.Figures().in_flight, 2u);
  b.FinishBackup(one, Status::OK());
  b.FinishBackup(two, Status::Unavailable("cut"));
  const BackupFigures f = b.Figures();
  EXPECT_EQ(f.in_flight, 0u);
  EXPECT_EQ(f.backed_up_files, 1u);
  EXPECT_EQ(f.failures, 1u);
  EXPECT_EQ(f.error, "next:1: " + Status::Unavailable("cut").ToString());
  EXPECT_EQ(host.calls, (std::vector<std::string>{"pin /a", "pin /b", "record /a OK",
                                                  "record /b " + Status::Unavailable("cut").ToString()}));
}

TEST(BackupsTest, NothingToSendIsNotInFlight) {
  FakeFeed feed;
  FakeHost host;
  host.pin = false;
  Backups b(&feed, &host);
  BackupJob job;
  EXPECT_FALSE(b.StartBackup({"j", "/a"}, &job));
  EXPECT_EQ(b.Figures().in_flight, 0u);
}

TEST(BackupsTest, AnErrorOutsideAJobIsCountedAndShown) {
  FakeHost host;
  Backups b(nullptr, &host);
  b.NoteBackupError("recovery from p: lost");
  EXPECT_EQ(b.Figures().failures, 1u);
  EXPECT_EQ(b.Figures().error, "recovery from p: lost");
}

TEST(BackupsTest, ARunOfFailuresIsAnErrorOnceAMinuteUntilASuccessEndsIt) {
  ManualClock clock;
  FakeHost host;
  Backups b(nullptr, &host, &clock);
  const Status cut = Status::Unavailable("cut");
  testing::internal::CaptureStderr();
  for (uint64_t i = 1; i < Backups::kFailingLoudly; ++i) b.NoteRingAttempt(cut, "backup of /a with p");
  std::string log = testing::internal::GetCapturedStderr();
  EXPECT_EQ(log.find("ring backups have failed"), std::string::npos) << log;  // not a run yet
  EXPECT_EQ(b.Figures().failing, Backups::kFailingLoudly - 1);

  testing::internal::CaptureStderr();
  b.NoteRingAttempt(cut, "backup of /a with p");
  b.NoteRingAttempt(cut, "backup of /a with p");  // within the minute: not again
  log = testing::internal::GetCapturedStderr();
  EXPECT_NE(log.find("ring backups have failed 3 times in a row"), std::string::npos) << log;
  EXPECT_EQ(log.find("failed 4 times"), std::string::npos) << log;
  EXPECT_EQ(b.Figures().failing, Backups::kFailingLoudly + 1);

  clock.Advance(std::chrono::minutes(1));
  testing::internal::CaptureStderr();
  b.NoteRingAttempt(cut, "backup of /a with p");
  log = testing::internal::GetCapturedStderr();
  EXPECT_NE(log.find("failed 5 times in a row"), std::string::npos) << log;

  b.NoteRingAttempt(Status::OK(), "backup of /a with p");
  EXPECT_EQ(b.Figures().failing, 0u);
  EXPECT_EQ(b.Figures().failures, 0u);  // attempts are not backups: only the run is counted
}

TEST(BackupsTest, TheFeedGetsTheWorkAndCopiesWithoutAHolderAreNotDropped) {
  FakeFeed feed;
  FakeHost host;
  Backups b(&feed, &host);
  EXPECT_TRUE(b.feeding());
  b.Send({"j", "/a"});
  b.SendTag(TagCopy{"j", "step1"});
  b.Drop(Held("/a", "next:1"));
  b.Drop(Held("/b", ""));  // nobody holds it
  FileInfo written = Held("/a", "next:1");
  written.disk.written = true;
  b.TellPersisted(written);
  b.TellPersisted(Held("/b", "next:1"));  // not written to storage
  FileInfo from_peer = written;
  from_peer.disk.from_peer = true;
  b.TellPersisted(from_peer);  // storage's identity came from the ring, not from this node
  b.Recover(RecoverJob{"j", 0, "next:1", "prev:1"});
  EXPECT_EQ(feed.calls, (std::vector<std::string>{"send /a", "tag step1", "drop /a@next:1",
                                                  "persisted /a@next:1", "recover j"}));
  feed.waiting = {{"j", "/c"}};
  EXPECT_EQ(b.Waiting(), feed.waiting);
}

TEST(BackupsTest, WithoutAFeedNothingIsQueued) {
  FakeHost host;
  Backups b(nullptr, &host);
  EXPECT_FALSE(b.feeding());
  b.Send({"j", "/a"});
  b.SendTag(TagCopy{"j", "step1"});
  b.Drop(Held("/a", "next:1"));
  b.Recover(RecoverJob{"j", 0, "next:1", "prev:1"});
  EXPECT_TRUE(b.Waiting().empty());
}

TEST(BackupsTest, TagsAndResendsAreTheHostsSteps) {
  FakeHost host;
  Backups b(nullptr, &host);
  TagInfo tag;
  std::string peer;
  int32_t node = -1;
  ASSERT_TRUE(b.StartTagBackup(TagCopy{"j", "step1"}, &tag, &peer, &node));
  EXPECT_EQ(tag.tag, "step1");
  EXPECT_EQ(peer, "next:1");
  EXPECT_EQ(node, 2);
  b.ResendBackups("j", "next:1");
  EXPECT_EQ(host.calls, (std::vector<std::string>{"tag step1", "forget j next:1"}));
}

}  // namespace
}  // namespace tce
