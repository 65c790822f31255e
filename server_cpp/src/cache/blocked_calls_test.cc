// Calls that block until something happens (GetVersion waiting for a newer
// version, Wait for persistence) end when their caller goes: its session
// closes, or its RPC is cancelled (CallerGone), so that a client that left
// holds no place among max_waits.
#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <thread>

#include "cache/cache.h"
#include "common/manual_clock.h"
#include "common/testing.h"
#include "env/env.h"

namespace tce {
namespace {

constexpr auto kNoDeadline = Clock::TimePoint::max();

class BlockedCallsTest : public ::testing::Test {
 protected:
  BlockedCallsTest() : cache_([this] {
    CacheOptions o(64 << 20);
    o.clock = &clock_;
    return o;
  }()) {
    session_ = cache_.sessions()->OpenSession(getuid(), getpid(), getgid());
  }

  // Runs `call` on a thread and returns once it waits on the clock.
  std::thread Blocked(std::function<void()> call) {
    const uint64_t before = clock_.waits();
    std::thread t(std::move(call));
    while (clock_.waits() == before) std::this_thread::yield();
    return t;
  }

  ManualClock clock_;
  Cache cache_;
  std::string session_;
};

TEST_F(BlockedCallsTest, AWaitForAVersionEndsWhenTheCallerGoes) {
  std::atomic<bool> gone{false};
  Status result;
  TagInfo tag;
  std::thread t = Blocked([&] {
    result = cache_.publication()->GetVersion(session_, "nobodys", 0, std::chrono::hours(24), kNoDeadline, &tag,
                               [&] { return gone.load(); });
  });
  gone = true;
  clock_.Advance(kCallerGonePoll);  // the call looks again within that
  t.join();
  EXPECT_EQ(result.code(), Status::Code::kCancelled);
  EXPECT_EQ(result.message(), "the caller went away");
}

TEST_F(BlockedCallsTest, AWaitForAVersionEndsWhenItsSessionCloses) {
  Status result;
  TagInfo tag;
  std::thread t = Blocked([&] {
    result = cache_.publication()->GetVersion(session_, "nobodys", 0, std::chrono::hours(24), kNoDeadline, &tag,
                               [] { return false; });
  });
  cache_.sessions()->CloseSession(session_);  // no time passes: the close itself wakes it
  t.join();
  EXPECT_EQ(result.code(), Status::Code::kUnauthenticated);
}

TEST_F(BlockedCallsTest, AWaitForPersistenceEndsWhenTheCallerGoesOrItsSessionCloses) {
  // A cache with a storage root whose persistence never runs (no feed):
  // the file stays CACHED and Wait blocks.
  const std::string dir = MakeTempDir("tce-blocked");
  CacheOptions o(64 << 20);
  o.storage = std::make_shared<const StorageRoots>(std::vector<std::string>{dir}, nullptr, PosixStoreOptions());
  o.clock = &clock_;
  Cache cache(o);
  const std::string s = cache.sessions()->OpenSession(getuid(), getpid(), getgid());
  const std::string path = dir + "/x.pt";
  AllocateResult a;
  ASSERT_TRUE(cache.Allocate({s, "job", "t", path, 0, 100}, &a).ok());
  FileInfo f;
  ASSERT_TRUE(cache.Commit(s, a.allocation_id, {}, &f).ok());

  std::atomic<bool> gone{false};
  Status result;
  std::vector<FileInfo> files;
  std::thread t = Blocked([&] {
    result = cache.Wait(s, "job", {path}, std::chrono::milliseconds(0), &files, [&] { return gone.load(); });
  });
  gone = true;
  clock_.Advance(kCallerGonePoll);
  t.join();
  EXPECT_EQ(result.code(), Status::Code::kCancelled);

  t = Blocked([&] { result = cache.Wait(s, "job", {path}, std::chrono::milliseconds(0), &files, [] { return false; }); });
  cache.sessions()->CloseSession(s);
  t.join();
  EXPECT_EQ(result.code(), Status::Code::kUnauthenticated);
  rmdir(dir.c_str());
}

}  // namespace
}  // namespace tce
