// Following a job over the peer port (ring/version_follower.h): a source (a
// Cache behind a PeerServer) and a following node (a Cache, a RangeReader
// and a VersionFollower), on loopback, both on one ManualClock.
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <memory>

#include "cache/cache.h"
#include "common/manual_clock.h"
#include "common/testing.h"
#include "ring/link_breaker.h"
#include "ring/peer_server.h"
#include "ring/peer_testing.h"
#include "ring/range_reader.h"
#include "ring/tcp_transport.h"
#include "ring/version_follower.h"

namespace tce {
namespace {
using namespace std::chrono_literals;

constexpr uid_t kUser = 1001;
constexpr char kSelf[] = "127.0.0.1:7071";  // the following node's endpoint (nothing listens there)

class FollowWatchTest : public ::testing::Test {
 protected:
  void SetUp() override {
    signal(SIGPIPE, SIG_IGN);
    PeerServerOptions po = LoopbackPeerOptions();
    po.clock = &clock_;
    server_ = std::make_unique<PeerServer>(po, transport_.get(), &store_, RingStores::Of(&source_));
    ASSERT_TRUE(server_->Start().ok());
    owner_ = source_.sessions()->OpenSession(getuid(), getpid());
    RangeReaderOptions ro;
    ro.self = kSelf;
    ro.key = "t";
    ro.clock = &clock_;
    ranges_ = std::make_unique<RangeReader>(RingStores::Of(&here_), ro);
    VersionFollowerOptions fo;
    fo.self = kSelf;
    fo.key = "t";
    fo.io_timeout = 5000ms;
    fo.hold = 10000ms;
    fo.retry = 1000ms;
    fo.retry_max = 4000ms;
    fo.owner = getuid();
    fo.clock = &clock_;
    fo.breaker = &breaker_;
    follower_ = std::make_unique<VersionFollower>(here_.replicas(), here_.publication(), ranges_.get(), fo);
  }
  void TearDown() override {
    breaker_.BreakAll();  // as the daemon stops: the questions held at the source end
    source_.StopWaits();
    follower_->Stop();
    server_->Stop();
  }

  // The source's owner saves and publishes `tag` (one file) and grants this node.
  void Publish(const std::string& tag) {
    ReadGrants::Ids ids{{}, {}, {kSelf}};
    ASSERT_TRUE(source_.publication()->GrantRead(owner_, "job", &ids, false).ok());
    AllocateResult a;
    ASSERT_TRUE(source_.Allocate({owner_, "job", tag, "/c/" + tag + ".safetensors", 0, 4096}, &a).ok());
    FileInfo f;
    ASSERT_TRUE(source_.Commit(owner_, a.allocation_id, {}, &f).ok());
    TagInfo t, out;
    t.job = "job", t.tag = tag, t.world_size = 1, t.files = {{0, "/c/" + tag + ".safetensors", 4096}};
    ASSERT_TRUE(source_.CommitTag(owner_, t, &out).ok());
  }
  Status Follow(uid_t uid, TagInfo* newest) {
    return follower_->Follow("job", {server_->endpoint()}, uid, Clock::TimePoint::max(), newest);
  }
  FollowedJobInfo Job() {
    std::vector<FollowedJobInfo> jobs = follower_->Jobs(true, 0);
    return jobs.empty() ? FollowedJobInfo() : jobs[0];
  }

  static CacheOptions OnClock(Clock* clock) {
    CacheOptions o(64 << 20);
    o.clock = clock;
    return o;
  }

  ManualClock clock_;
  Cache source_{OnClock(&clock_)};
  Cache here_{OnClock(&clock_)};
  BackupStore store_{16 << 20};
  LinkBreaker breaker_;
  std::unique_ptr<Transport> transport_ = NewTcpTransport(1);
  std::unique_ptr<PeerServer> server_;
  std::unique_ptr<RangeReader> ranges_;
  std::unique_ptr<VersionFollower> follower_;
  std::string owner_;
};

TEST_F(FollowWatchTest, AJobTheSourceDoesNotKnowIsAskedAgainAfterAPauseThatDoublesToItsCap) {
  TagInfo newest;
  ASSERT_TRUE(Follow(kUser, &newest).ok());  // not there yet
  EXPECT_EQ(newest.version, 0u);
  // Each round fails at once (the source knows no such job); the pause
  // after it is 1 s, 2 s, 4 s, then stays at 4 s (retry_max).
  uint64_t round = 0;
  for (auto pause : {1000ms, 2000ms, 4000ms, 4000ms}) {
    ++round;
    ASSERT_TRUE(Eventually([&] { return Job().failures == round && Job().retry_in == pause; }))
        << "round " << round << ": " << Job().failures << " failures, next in " << Job().retry_in.count() << " ms";
    EXPECT_EQ(Job().last_error, server_->endpoint() + ": job 'job' has no published version here");
    clock_.Advance(pause - 1ms);  // not yet: no round
    ASSERT_TRUE(Eventually([&] { return Job().retry_in == 1ms; }));
    EXPECT_EQ(Job().failures, round);
    clock_.Advance(1ms);
  }
  ASSERT_TRUE(Eventually([&] { return Job().failures == 5 && Job().retry_in == 4000ms; }));
  // The job appears there: the next round finds it, and the watcher follows.
  Publish("step1");
  clock_.Advance(4000ms);
  ASSERT_TRUE(Eventually([&] { return Job().version == 1 && Job().failures == 0; }));
  EXPECT_EQ(Job().last_error, "");
  TagInfo t;
  EXPECT_TRUE(here_.replicas()->VersionTag("job", "step1", &t));
}

TEST_F(FollowWatchTest, ANewFollowOfAFailingJobAsksAgainAtOnce) {
  TagInfo newest;
  ASSERT_TRUE(Follow(kUser, &newest).ok());
  ASSERT_TRUE(Eventually([&] { return Job().failures == 1; }));
  Publish("step1");  // a user who asks to follow now does not wait out the pause
  ASSERT_TRUE(Follow(kUser + 1, &newest).ok());
  EXPECT_EQ(newest.version, 1u);
  ASSERT_TRUE(Eventually([&] { return Job().failures == 0; }));
}

TEST_F(FollowWatchTest, AJobGrantedBeforeItsFirstVersionIsFollowedAndItsFirstVersionArrives) {
  // The trainer's user granted this node at its start; nothing is published yet.
  ReadGrants::Ids ids{{}, {}, {kSelf}};
  ASSERT_TRUE(source_.publication()->GrantRead(owner_, "job", &ids, false).ok());
  TagInfo newest;
  ASSERT_TRUE(Follow(kUser, &newest).ok());  // followed, no version yet
  EXPECT_EQ(newest.version, 0u);
  ASSERT_EQ(follower_->Jobs(true, 0).size(), 1u);
  Publish("step1");  // the question held at the source is answered
  ASSERT_TRUE(Eventually([&] { return Job().version == 1 && Job().failures == 0; }));
  TagInfo t;
  EXPECT_TRUE(here_.replicas()->VersionTag("job", "step1", &t));
}

}  // namespace
}  // namespace tce
