#include "cache/session_table.h"

#include <gtest/gtest.h>

#include <chrono>

namespace tce {
namespace {

using namespace std::chrono_literals;

TEST(SessionTable, SessionsHaveRandomIdsAndTheirPeersCredentials) {
  SessionTable t;
  const std::string a = t.Open(1000, 42, 100);
  const std::string b = t.Open(1000, 42, 100);
  EXPECT_EQ(a.size(), 32u);
  EXPECT_EQ(a.find_first_not_of("0123456789abcdef"), std::string::npos) << a;
  EXPECT_NE(a, b);
  ASSERT_NE(t.Find(a), nullptr);
  EXPECT_EQ(t.Find(a)->uid, 1000u);
  EXPECT_EQ(t.Find(a)->gid, 100u);
  EXPECT_EQ(t.Find(a)->pid, 42);
  EXPECT_EQ(t.size(), 2u);
  EXPECT_TRUE(t.Check(a).ok());
  t.Erase(a);
  EXPECT_EQ(t.Find(a), nullptr);
  Status s = t.Check(a);
  EXPECT_EQ(s.code(), Status::Code::kUnauthenticated);
  EXPECT_NE(s.message().find("open a session on the server's fd socket"), std::string::npos)
      << s.message();
}

TEST(SessionTable, LeasesAreCountedCappedAndOwned) {
  SessionTable t;
  t.set_max_leases(2);
  const std::string a = t.Open(1, 1, 1), b = t.Open(2, 2, 2);
  const uint64_t l1 = t.AddLease(a, 7);
  const uint64_t l2 = t.AddLease(a, 8);
  EXPECT_NE(l1, 0u);
  EXPECT_NE(l1, l2);
  EXPECT_EQ(t.Find(a)->leases, 2u);
  EXPECT_EQ(t.leases(), 2u);
  Status full = t.CanLease(a);
  EXPECT_EQ(full.code(), Status::Code::kResourceExhausted);
  EXPECT_NE(full.message().find("max_leases_per_session=2"), std::string::npos) << full.message();
  EXPECT_TRUE(t.CanLease(b).ok());
  EXPECT_TRUE(t.Leases(a, 7));
  EXPECT_FALSE(t.Leases(b, 7));
  EXPECT_EQ(t.CheckLease(b, l1).code(), Status::Code::kNotFound);  // not b's lease
  EXPECT_TRUE(t.CheckLease(a, l1).ok());
  EXPECT_EQ(t.LeasesOf(a), (std::vector<uint64_t>{l1, l2}));
  EXPECT_EQ(t.DropLease(l1), 7u);
  EXPECT_EQ(t.DropLease(l1), 0u);  // already gone
  EXPECT_EQ(t.Find(a)->leases, 1u);
  EXPECT_TRUE(t.CanLease(a).ok());
  EXPECT_EQ(t.CheckLease(a, l1).code(), Status::Code::kNotFound);
}

TEST(SessionTable, IdleSessionsHoldNoLeaseAndAreNotBusy) {
  SessionTable t;
  const std::string quiet = t.Open(1, 1, 1), leasing = t.Open(1, 2, 1), busy = t.Open(1, 3, 1);
  t.AddLease(leasing, 5);
  EXPECT_EQ(t.Idle(0ms, {busy}), (std::vector<std::string>{quiet}));
  EXPECT_TRUE(t.Idle(1h, {}).empty());  // all used just now
}

TEST(SessionTable, UnmapsOwedAreDeliveredOnce) {
  SessionTable t;
  const std::string a = t.Open(1, 1, 1);
  t.OweUnmap(a, 3);
  t.OweUnmap(a, 4);
  t.OweUnmap("no-such-session", 5);
  std::vector<uint64_t> out{1};
  t.TakeUnmaps(a, &out);
  EXPECT_EQ(out, (std::vector<uint64_t>{1, 3, 4}));
  out.clear();
  t.TakeUnmaps(a, &out);
  EXPECT_TRUE(out.empty());
  t.TakeUnmaps("no-such-session", &out);
  EXPECT_TRUE(out.empty());
}

}  // namespace
}  // namespace tce
