// Rings' own rules (cache/rings.h), against a host and a metadata sink that
// record what they are asked: who sent a copy (CheckRingSender's errors), a
// ring that does not name this server refused, a told ring recorded and its
// setter remembered, peers' uids checked and claimed, and the rings of a
// restart rejoined. Then the Cache as the host: joining a ring with nothing
// of the job in memory begins a restore, joining with files re-queues them.
#include "cache/rings.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <string>
#include <vector>

#include "cache/cache.h"

namespace tce {
namespace {

// Records each call; admission answers `admit`, file owners come from `owner`.
class FakeHost : public RingsHost {
 public:
  explicit FakeHost(Rings** rings) : rings_(rings) {}
  Status AdmitRingSetter(const std::string& session, const std::string& job, uid_t* uid, gid_t* gid) override {
    calls.push_back("admit " + session + " " + job);
    *uid = 1001;
    *gid = 101;
    return admit;
  }
  std::string JoinRing(const JoinedRing& ring) override {
    calls.push_back("join " + ring.job + (ring.told ? " told" : ""));
    Ring now;
    (*rings_)->Apply(ring, &now);
    return now.successor;
  }
  bool FileOwner(const std::string& job, uid_t* uid) override {
    if (!has_owner) return false;
    *uid = owner;
    return true;
  }
  bool OwnerOrClaim(const std::string& job, uid_t uid, uid_t* here) override {
    calls.push_back("claim " + job + " " + std::to_string(uid));
    if (FileOwner(job, here)) return true;
    has_owner = true;
    owner = uid;
    return false;
  }
  bool LostFromMemory(const std::string& job, const std::string& path) override {
    calls.push_back("lost " + path);
    return true;
  }
  Status CheckRangeRead(const std::string& session, const std::string& job) override {
    return Status::PermissionDenied("ranges of " + job);
  }

  std::vector<std::string> calls;
  Status admit;
  bool has_owner = false;
  uid_t owner = 0;

 private:
  Rings** rings_;
};

class FakeMeta : public MetaSink {
 public:
  void Record(const FileInfo&, bool) override {}
  void RecordTag(const TagInfo&) override {}
  void RecordRing(const RingInfo& ring) override { rings.push_back(ring); }
  std::vector<RingInfo> rings;
};

class RingsTest : public ::testing::Test {
 protected:
  RingsTest() : host_(&self_), rings_(&meta_, &host_) { self_ = &rings_; }

  Rings* self_ = nullptr;
  FakeMeta meta_;
  FakeHost host_;
  Rings rings_;
};

TEST_F(RingsTest, OnlyTheNodeTheRingNamesSendsAsThatNode) {
  Status s = rings_.CheckRingSender("j", 1, "b:2");
  EXPECT_EQ(s.code(), Status::Code::kPermissionDenied);
  EXPECT_EQ(s.message(), "this server was not told job j's ring: it takes copies only from the node the ring "
                         "names (tell it the ring)");
  std::string successor;
  ASSERT_TRUE(rings_.SetRing("s", "j", 0, {"a:1", "b:2", "c:3"}, &successor).ok());
  EXPECT_EQ(successor, "b:2");
  EXPECT_TRUE(rings_.CheckRingSender("j", 1, "b:2").ok());
  EXPECT_EQ(rings_.CheckRingSender("j", 0, "a:1").message(), "node 0 is not another node of job j's ring here");
  EXPECT_EQ(rings_.CheckRingSender("j", 3, "b:2").message(), "node 3 is not another node of job j's ring here");
  s = rings_.CheckRingSender("j", 2, "b:2");
  EXPECT_EQ(s.code(), Status::Code::kPermissionDenied);
  EXPECT_EQ(s.message(), "b:2 is not node 2 of job j's ring here (c:3 is)");
  EXPECT_EQ(rings_.RingPeers("j"), (std::vector<std::string>{"b:2", "c:3"}));
  EXPECT_EQ(rings_.RingNodes("j"), (std::vector<std::string>{"a:1", "b:2", "c:3"}));
}

TEST_F(RingsTest, ARingMustNameThisServerAsItsNode) {
  rings_.SetSelfEndpoint("a:1");
  std::string successor;
  Status s = rings_.SetRing("s", "j", 1, {"a:1", "b:2"}, &successor);
  EXPECT_EQ(s.code(), Status::Code::kInvalidArgument);
  EXPECT_EQ(s.message(), "endpoints[1] is b:2, but this server is a:1: a ring names each server as its own node");
  EXPECT_EQ(host_.calls, (std::vector<std::string>{"admit s j"}));  // admitted, never joined
  EXPECT_TRUE(rings_.RingPeers("j").empty());
  EXPECT_TRUE(meta_.rings.empty());
  // A ring of one node is this server's whatever it is called.
  ASSERT_TRUE(rings_.SetRing("s", "solo", 0, {"x:9"}, &successor).ok());
  EXPECT_EQ(successor, "");
}

TEST_F(RingsTest, AToldRingIsRecordedAndItsSetterOwnsTheJob) {
  std::string successor;
  ASSERT_TRUE(rings_.SetRing("s", "j", 0, {"a:1", "b:2"}, &successor).ok());
  EXPECT_TRUE(meta_.rings.empty());  // this server's endpoint unknown: nothing to record it for
  EXPECT_TRUE(rings_.Recorded().empty());
  rings_.SetSelfEndpoint("a:1");
  ASSERT_TRUE(rings_.SetRing("s", "j", 0, {"a:1", "b:2"}, &successor).ok());
  ASSERT_EQ(meta_.rings.size(), 1u);
  EXPECT_EQ(meta_.rings[0].self, "a:1");
  EXPECT_EQ(meta_.rings[0].endpoints, (std::vector<std::string>{"a:1", "b:2"}));
  ASSERT_EQ(rings_.Recorded().size(), 1u);
  uid_t uid = 0;
  ASSERT_TRUE(rings_.JobUid("j", &uid));  // no file owner: the uid that set the ring
  EXPECT_EQ(uid, 1001u);
  host_.has_owner = true;
  host_.owner = 7;
  ASSERT_TRUE(rings_.JobUid("j", &uid));  // the files' owner first
  EXPECT_EQ(uid, 7u);
}

TEST_F(RingsTest, AdmissionAndValidationErrorsComeInOrder) {
  std::string successor;
  host_.admit = Status::PermissionDenied("not yours");
  EXPECT_EQ(rings_.SetRing("s", "j", 5, {}, &successor).message(), "not yours");
  host_.admit = Status::OK();
  Status s = rings_.SetRing("s", "j", 5, {"a:1"}, &successor);
  EXPECT_EQ(s.code(), Status::Code::kInvalidArgument);
  EXPECT_EQ(s.message(), "node_rank 5 is outside the 1-node ring");
  EXPECT_EQ(rings_.SetRing("s", "j", 0, {"nocolon"}, &successor).message(),
            "ring endpoint must be host:port, got 'nocolon'");
  EXPECT_EQ(rings_.CheckRangeRead("s", "j").message(), "ranges of j");  // the host's check
}

TEST_F(RingsTest, APeerActsForAJobAsTheUidItBelongsTo) {
  EXPECT_EQ(rings_.CheckPeerUid("j", false, 0, "b:2", "hold its copies", true).message(),
            "b:2 names no uid for job j: it may not hold its copies");
  EXPECT_EQ(rings_.CheckPeerUid("j", true, 5, "b:2", "read its files", false).message(),
            "job j belongs to no uid here yet: b:2 may not read its files");
  EXPECT_TRUE(rings_.CheckPeerUid("j", true, 5, "b:2", "hold its copies", true).ok());  // claimed
  EXPECT_EQ(host_.calls, (std::vector<std::string>{"claim j 5"}));
  EXPECT_TRUE(rings_.CheckPeerUid("j", true, 5, "b:2", "read its files", false).ok());
  Status s = rings_.CheckPeerUid("j", true, 6, "b:2", "hold its tags", true);
  EXPECT_EQ(s.code(), Status::Code::kPermissionDenied);
  EXPECT_EQ(s.message(), "job j belongs to uid 5 here, and b:2 acts for it as uid 6: it may not hold its tags "
                         "(a job belongs to one uid on every node of its ring)");
}

TEST_F(RingsTest, OnlyARingWithASuccessorMayHoldAMissedFile) {
  EXPECT_FALSE(rings_.MayBeInRing("j", "/c/x.pt"));
  std::string successor;
  ASSERT_TRUE(rings_.SetRing("s", "j", 0, {"a:1"}, &successor).ok());
  EXPECT_FALSE(rings_.MayBeInRing("j", "/c/x.pt"));
  ASSERT_TRUE(rings_.SetRing("s", "j", 0, {"a:1", "b:2"}, &successor).ok());
  EXPECT_TRUE(rings_.MayBeInRing("j", "/c/x.pt"));
  EXPECT_EQ(host_.calls.back(), "lost /c/x.pt");  // and only then the files are asked
}

TEST_F(RingsTest, RecordedRingsAreRejoinedUntold) {
  rings_.SetSelfEndpoint("a:1");
  rings_.RestoreRings({RingInfo{"j", "a:1", 0, {"a:1", "b:2"}}, RingInfo{"bad", "a:1", 3, {"a:1"}}});
  EXPECT_EQ(host_.calls, (std::vector<std::string>{"join j"}));  // the invalid one skipped
  EXPECT_EQ(rings_.Successor("j"), "b:2");
  EXPECT_TRUE(meta_.rings.empty());  // already recorded
  uid_t uid = 0;
  EXPECT_FALSE(rings_.JobUid("j", &uid));  // no client set it here
}

// The Cache as Rings' host.
class FakeFeed : public BackupFeed {
 public:
  void Send(const FileKey& key) override { calls.push_back("send " + key.second); }
  void SendTag(TagCopy tag) override { calls.push_back("tag " + tag.tag); }
  void Drop(DropCopy drop) override { calls.push_back("drop " + drop.path); }
  void Persisted(PersistedCopy copy) override { calls.push_back("persisted " + copy.path); }
  void Recover(RecoverJob recover) override {
    calls.push_back("recover " + recover.job + " from " + recover.peer + " after " + recover.predecessor);
  }
  std::vector<FileKey> Waiting() const override { return {}; }
  std::vector<std::string> calls;
};

class CacheRingsTest : public ::testing::Test {
 protected:
  CacheRingsTest()
      : cache_([&] {
          CacheOptions o(8 << 20);
          o.backup_feed = &feed_;
          return o;
        }()),
        session_(cache_.sessions()->OpenSession(getuid(), getpid(), getgid())) {}

  FakeFeed feed_;
  Cache cache_;
  std::string session_;
};

TEST_F(CacheRingsTest, JoiningWithNothingInMemoryBeginsARestore) {
  std::string successor;
  ASSERT_TRUE(cache_.rings()->SetRing(session_, "j", 1, {"a:1", "b:2", "c:3"}, &successor).ok());
  EXPECT_EQ(successor, "c:3");
  EXPECT_EQ(feed_.calls, (std::vector<std::string>{"recover j from c:3 after a:1"}));
  EXPECT_TRUE(cache_.restores()->InProgress("j"));
  uid_t uid = 0;
  ASSERT_TRUE(cache_.rings()->JobUid("j", &uid));
  EXPECT_EQ(uid, getuid());
}

TEST_F(CacheRingsTest, JoiningWithFilesQueuesThemToTheNewSuccessor) {
  AllocateResult a;
  ASSERT_TRUE(cache_.Allocate({session_, "j", "t", "/c/x.pt", 0, 100}, &a).ok());
  FileInfo f;
  ASSERT_TRUE(cache_.Commit(session_, a.allocation_id, {}, &f).ok());
  std::string successor;
  ASSERT_TRUE(cache_.rings()->SetRing(session_, "j", 0, {"a:1", "b:2"}, &successor).ok());
  EXPECT_EQ(feed_.calls, (std::vector<std::string>{"send /c/x.pt"}));  // no restore: memory holds the job
  EXPECT_FALSE(cache_.restores()->InProgress("j"));
  EXPECT_FALSE(cache_.rings()->MayBeInRing("j", "/c/x.pt"));  // in memory here
  EXPECT_TRUE(cache_.rings()->MayBeInRing("j", "/c/y.pt"));   // unknown here
  feed_.calls.clear();
  ASSERT_TRUE(cache_.rings()->SetRing(session_, "j", 0, {"a:1", "b:2"}, &successor).ok());
  EXPECT_TRUE(feed_.calls.empty());  // the same successor: nothing again
}

}  // namespace
}  // namespace tce
