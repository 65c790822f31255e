// Sessions (cache/sessions.h), as the fd socket and the RPC layer see it
// (the Cache's component, Cache::sessions()): unknown sessions, the
// callers' ids, the lease limit, idle sessions on a ManualClock, and what a
// closed session held in the Cache.
#include "cache/sessions.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <set>
#include <string>
#include <vector>

#include "cache/cache_fixture.h"
#include "common/manual_clock.h"

namespace tce {
namespace {

using namespace std::chrono_literals;
using cache_testing::CacheTest;
using cache_testing::kMiB;

constexpr char kUnknown[] =
    "unknown session 'nope': open a session on the server's fd socket (<socket>.fd) first";

SessionLimits OneLease() {
  SessionLimits l;
  l.max_leases_per_session = 1;
  return l;
}

class SessionsTest : public CacheTest {
 protected:
  SessionsTest() : CacheTest(64 * kMiB, /*manual_clock=*/true, OneLease()) {}
  Sessions& sessions() { return *cache_.sessions(); }
  // A lease on `path` (saved by `session` before) for `session`.
  Status Lease(const std::string& session, const std::string& path, uint64_t* lease_id) {
    FileInfo f;
    std::vector<uint64_t> unmap;
    return cache_.Lookup(session, "job", path, /*lease=*/true, &f, lease_id, &unmap);
  }
};

TEST_F(SessionsTest, AnUnknownSessionIsUnauthenticatedEverywhere) {
  bool admin = false;
  uid_t uid = 0;
  gid_t gid = 0;
  Status s = sessions().CheckCaller("nope", &admin, &uid);
  EXPECT_EQ(s.code(), Status::Code::kUnauthenticated);
  EXPECT_EQ(s.message(), kUnknown);
  s = sessions().CallerIds("nope", &uid, &gid);
  EXPECT_EQ(s.code(), Status::Code::kUnauthenticated);
  EXPECT_EQ(s.message(), kUnknown);
  int fd = -1;
  bool writable = false;
  uint64_t capacity = 0;
  s = sessions().FdFor("nope", 1, &fd, &writable, &capacity);
  EXPECT_EQ(s.code(), Status::Code::kUnauthenticated);
  EXPECT_EQ(s.message(), kUnknown);
  Status alloc;
  Alloc("nope", "/ckpt/a.pt", 1024, &alloc);
  EXPECT_EQ(alloc.code(), Status::Code::kUnauthenticated);
  EXPECT_EQ(alloc.message(), kUnknown);
  sessions().CloseSession("nope");  // nothing to close: no harm
  EXPECT_EQ(cache_.Stats().sessions, 0u);
}

TEST_F(SessionsTest, CallersActWithTheirSessionsIds) {
  const std::string user = sessions().OpenSession(1000, 42, 100);
  const std::string root = sessions().OpenSession(0, 43);
  uid_t uid = 0;
  gid_t gid = 0;
  ASSERT_TRUE(sessions().CallerIds(user, &uid, &gid).ok());
  EXPECT_EQ(uid, 1000u);
  EXPECT_EQ(gid, 100u);
  ASSERT_TRUE(sessions().CallerIds(root, &uid, &gid).ok());
  EXPECT_EQ(uid, 0u);
  EXPECT_EQ(gid, static_cast<gid_t>(-1));  // unknown
  bool admin = true;
  ASSERT_TRUE(sessions().CheckCaller(user, &admin, &uid).ok());
  EXPECT_FALSE(admin);
  EXPECT_EQ(uid, 1000u);
  ASSERT_TRUE(sessions().CheckCaller(root, &admin).ok());
  EXPECT_TRUE(admin);  // root_is_admin (the default)
  EXPECT_EQ(cache_.Stats().sessions, 2u);
}

TEST(SessionsAdmin, RootIsNoAdministratorWhenTheSettingSaysSo) {
  SessionLimits limits;
  limits.root_is_admin = false;
  CacheOptions o(8 * kMiB);
  o.limits = limits;
  Cache cache(std::move(o));
  const std::string root = cache.sessions()->OpenSession(0, 1, 0);
  bool admin = true;
  ASSERT_TRUE(cache.sessions()->CheckCaller(root, &admin).ok());
  EXPECT_FALSE(admin);
}

TEST_F(SessionsTest, ASessionHoldsAtMostMaxLeasesPerSession) {
  const std::string s = sessions().OpenSession(getuid(), getpid());
  Save(s, "/ckpt/a.pt", 1024);
  Save(s, "/ckpt/b.pt", 1024);
  uint64_t first = 0, second = 0;
  ASSERT_TRUE(Lease(s, "/ckpt/a.pt", &first).ok());
  Status full = Lease(s, "/ckpt/b.pt", &second);
  EXPECT_EQ(full.code(), Status::Code::kResourceExhausted);
  EXPECT_EQ(full.message(),
            "this session holds 1 leases (max_leases_per_session=1): release loaded files before loading more");
  // Another session has leases of its own.
  const std::string other = sessions().OpenSession(getuid(), getpid());
  ASSERT_TRUE(Lease(other, "/ckpt/b.pt", &second).ok());
  EXPECT_EQ(cache_.Stats().leases, 2u);
  ASSERT_TRUE(cache_.Release(s, {first}, {}).ok());
  EXPECT_TRUE(Lease(s, "/ckpt/b.pt", &second).ok());
}

TEST_F(SessionsTest, IdleSessionsHaveNoRequestNoLeaseAndNoPendingAllocation) {
  const std::string quiet = sessions().OpenSession(getuid(), getpid());
  const std::string saving = sessions().OpenSession(getuid(), getpid());
  const std::string leasing = sessions().OpenSession(getuid(), getpid());
  const std::string asking = sessions().OpenSession(getuid(), getpid());
  Save(leasing, "/ckpt/a.pt", 1024);
  uint64_t lease = 0;
  ASSERT_TRUE(Lease(leasing, "/ckpt/a.pt", &lease).ok());
  Alloc(saving, "/ckpt/b.pt", 1024);  // PENDING from now on
  EXPECT_TRUE(sessions().IdleSessions(10s).empty());
  clock_.Advance(10s);
  bool admin = false;
  ASSERT_TRUE(sessions().CheckCaller(asking, &admin).ok());  // a request names it
  std::vector<std::string> idle = sessions().IdleSessions(10s);
  EXPECT_EQ(idle, std::vector<std::string>{quiet});
  clock_.Advance(10s);
  idle = sessions().IdleSessions(10s);
  std::vector<std::string> want = {quiet, asking};
  std::sort(want.begin(), want.end());
  EXPECT_EQ(idle, want);
}

TEST_F(SessionsTest, ClosingASessionEndsWhatItHeldInTheCache) {
  const std::string s = sessions().OpenSession(getuid(), getpid());
  Save(s, "/ckpt/a.pt", 1024);
  uint64_t lease = 0;
  ASSERT_TRUE(Lease(s, "/ckpt/a.pt", &lease).ok());
  AllocateResult pending = Alloc(s, "/ckpt/b.pt", 2048);
  CacheStats before = cache_.Stats();
  EXPECT_EQ(before.sessions, 1u);
  EXPECT_EQ(before.leases, 1u);
  EXPECT_GT(before.pending, 0u);

  sessions().CloseSession(s);
  CacheStats after = cache_.Stats();
  EXPECT_EQ(after.sessions, 0u);
  EXPECT_EQ(after.leases, 0u);  // its lease dropped
  EXPECT_EQ(after.pending, 0u);  // its allocation aborted
  FileInfo f;
  Status commit = cache_.Commit(s, pending.allocation_id, {}, &f);
  EXPECT_EQ(commit.code(), Status::Code::kUnauthenticated);
  // Another session may take the lease the closed one held.
  const std::string next = sessions().OpenSession(getuid(), getpid());
  EXPECT_TRUE(Lease(next, "/ckpt/a.pt", &lease).ok());
}

// A host as the Cache is one: each step calls back into Sessions (which
// would deadlock if Sessions held its lock while calling the host).
class FakeHost : public SessionHost {
 public:
  bool EndSession(const std::string& session) override {
    if (!sessions->Find(session)) return false;
    for (uint64_t lease : sessions->LeasesOf(session)) dropped.push_back(sessions->DropLease(lease));
    sessions->Forget(session);
    return true;
  }
  void SessionEnded(const std::string& session) override { ended.push_back(session); }
  std::set<std::string> BusySessions() override { return busy; }
  Status FdFor(const std::string& session, uint64_t, int*, bool*, uint64_t*, bool) override {
    return sessions->Check(session);
  }

  Sessions* sessions = nullptr;
  std::set<std::string> busy;
  std::vector<uint64_t> dropped;  // the buffers the ended leases held
  std::vector<std::string> ended;
};

TEST(SessionsAlone, ClosingEndsTheSessionInTheHostAndTellsTheRestOnce) {
  ManualClock clock;
  FakeHost host;
  Sessions sessions(OneLease(), &host, &clock);
  host.sessions = &sessions;
  const std::string a = sessions.OpenSession(1000, 7, 100);
  const std::string b = sessions.OpenSession(1000, 8, 100);
  ASSERT_TRUE(sessions.CanLease(a).ok());
  sessions.AddLease(a, 42);
  EXPECT_EQ(sessions.CanLease(a).code(), Status::Code::kResourceExhausted);
  EXPECT_EQ(sessions.leases(), 1u);

  host.busy = {b};
  clock.Advance(std::chrono::seconds(5));
  EXPECT_TRUE(sessions.IdleSessions(std::chrono::seconds(5)).empty());  // a leases, b allocates
  host.busy.clear();
  EXPECT_EQ(sessions.IdleSessions(std::chrono::seconds(5)), std::vector<std::string>{b});

  sessions.CloseSession(a);
  sessions.CloseSession(a);  // already gone: the rest is told once
  EXPECT_EQ(host.dropped, std::vector<uint64_t>{42});
  EXPECT_EQ(host.ended, std::vector<std::string>{a});
  EXPECT_EQ(sessions.size(), 1u);
  EXPECT_EQ(sessions.leases(), 0u);
  int fd = -1;
  bool writable = false;
  uint64_t capacity = 0;
  Status s = sessions.FdFor(a, 1, &fd, &writable, &capacity);
  EXPECT_EQ(s.code(), Status::Code::kUnauthenticated);
  EXPECT_NE(s.message().find("open a session on the server's fd socket (<socket>.fd) first"), std::string::npos);
}

}  // namespace
}  // namespace tce
