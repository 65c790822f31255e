#include "ring/ring_fetch.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <thread>

#include "cache/cache.h"
#include "common/manual_clock.h"

namespace tce {
namespace {

using namespace std::chrono_literals;

class RingFetchTest : public ::testing::Test {
 protected:
  RingFetchTest() : cache_(8 << 20) {
    session_ = cache_.sessions()->OpenSession(getuid(), getpid());
    std::string successor;
    EXPECT_TRUE(cache_.rings()->SetRing(session_, "job", 0, {"a:1", "b:2"}, &successor).ok());
  }
  Status Load(RingFetch& r, const std::string& path, bool lease = true) {
    FileInfo f;
    uint64_t lease_id = 0;
    std::vector<uint64_t> unmap{7};
    return r.Lookup(session_, "job", path, lease, &f, &lease_id, &unmap);
  }
  Cache cache_;
  std::string session_;
  int fetches_ = 0;
};

TEST_F(RingFetchTest, AMissIsRememberedForItsTtl) {
  ManualClock clock;
  RingFetch r(&cache_, cache_.rings(), cache_.restores(), [&](const std::string&, const std::string&, LoadFrom*, Clock::TimePoint) {
    ++fetches_;
    return Status::NotFound("no peer holds it");
  }, nullptr, 50ms, &clock);
  EXPECT_EQ(Load(r, "/c/x.pt").code(), Status::Code::kNotFound);
  clock.Advance(49ms);
  EXPECT_EQ(Load(r, "/c/x.pt").code(), Status::Code::kNotFound);
  EXPECT_EQ(fetches_, 1);  // the second load went to storage without asking
  EXPECT_EQ(r.remote_misses(), 1u);
  clock.Advance(1ms);
  EXPECT_EQ(Load(r, "/c/x.pt").code(), Status::Code::kNotFound);
  EXPECT_EQ(fetches_, 2);
  EXPECT_EQ(r.remote_reads(), 0u);
}

TEST_F(RingFetchTest, OnlyLoadsOfFilesThatMayBeInTheRingAsk) {
  RingFetch r(&cache_, cache_.rings(), cache_.restores(), [&](const std::string&, const std::string&, LoadFrom*, Clock::TimePoint) {
    ++fetches_;
    return Status::Unavailable("peer down");
  });
  EXPECT_EQ(Load(r, "/c/x.pt", /*lease=*/false).code(), Status::Code::kNotFound);
  EXPECT_EQ(fetches_, 0);
  FileInfo f;
  uint64_t lease_id = 0;
  std::vector<uint64_t> unmap;
  EXPECT_EQ(r.Lookup(session_, "other-job", "/c/x.pt", true, &f, &lease_id, &unmap).code(),
            Status::Code::kNotFound);  // no ring for that job
  EXPECT_EQ(fetches_, 0);
  EXPECT_EQ(Load(r, "/c/x.pt").code(), Status::Code::kNotFound);  // a failed fetch: the miss stands
  EXPECT_EQ(fetches_, 1);
  EXPECT_EQ(Load(r, "/c/x.pt").code(), Status::Code::kNotFound);  // not remembered: asked again
  EXPECT_EQ(fetches_, 2);
  EXPECT_EQ(r.remote_misses(), 0u);
}

TEST_F(RingFetchTest, ALoadWaitsForAnotherLoadsFetchOnlyUntilItsOwnDeadline) {
  ManualClock clock;
  Mutex mu;
  CondVar cv;
  bool started = false, release = false;
  Clock::TimePoint passed;  // the deadline the fetch was given
  RingFetch r(&cache_, cache_.rings(), cache_.restores(), [&](const std::string&, const std::string&, LoadFrom*, Clock::TimePoint d) {
    MutexLock l(&mu);
    passed = d;
    started = true;
    cv.SignalAll();
    while (!release) cv.Wait(&mu);  // a peer that does not answer
    return Status::NotFound("no peer holds it");
  }, nullptr, 5s, &clock);
  std::thread first([&] {
    FileInfo f;
    uint64_t lease_id = 0;
    std::vector<uint64_t> unmap;
    EXPECT_EQ(r.Lookup(session_, "job", "/c/x.pt", true, &f, &lease_id, &unmap, clock.Now() + 60s).code(),
              Status::Code::kNotFound);
  });
  {
    MutexLock l(&mu);
    while (!started) cv.Wait(&mu);
  }
  EXPECT_EQ(passed, clock.Now() + 60s);  // the fetch itself is bounded by its caller's deadline
  FileInfo f;
  uint64_t lease_id = 0;
  std::vector<uint64_t> unmap;
  Status second;
  const uint64_t waits = clock.waits();
  const Clock::TimePoint deadline = clock.Now() + 2s;
  std::thread joiner([&] { second = r.Lookup(session_, "job", "/c/x.pt", true, &f, &lease_id, &unmap, deadline); });
  while (clock.waits() == waits) std::this_thread::sleep_for(1ms);  // waiting on the first load's fetch
  clock.Advance(2s);
  joiner.join();
  EXPECT_EQ(second.code(), Status::Code::kDeadlineExceeded) << second.ToString();
  {
    MutexLock l(&mu);
    release = true;
    cv.SignalAll();
  }
  first.join();
}

TEST_F(RingFetchTest, AFetchThatFoundTheFileLooksAgain) {
  RingFetch r(&cache_, cache_.rings(), cache_.restores(), [&](const std::string&, const std::string&, LoadFrom*, Clock::TimePoint) {
    ++fetches_;
    return Status::OK();  // (nothing installed: the second lookup still misses)
  });
  EXPECT_EQ(Load(r, "/c/x.pt").code(), Status::Code::kNotFound);
  EXPECT_EQ(fetches_, 1);
  EXPECT_EQ(r.remote_reads(), 1u);
}

}  // namespace
}  // namespace tce
