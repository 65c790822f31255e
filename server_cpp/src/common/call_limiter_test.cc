#include "common/call_limiter.h"

#include <gtest/gtest.h>

#include <vector>

namespace tce {
namespace {

TEST(CallLimiter, OneKeyGetsItsShareThenIsRefusedNamingTheSetting) {
  CallLimiter limiter(4, 2, "max_peer_calls", "max_peer_calls_per_uid");
  CallLimiter::Slot a, b, c;
  ASSERT_TRUE(limiter.Enter(7, &a).ok());
  ASSERT_TRUE(limiter.Enter(7, &b).ok());
  Status s = limiter.Enter(7, &c);
  EXPECT_EQ(s.code(), Status::Code::kResourceExhausted);
  EXPECT_NE(s.message().find("(max_peer_calls_per_uid=2)"), std::string::npos) << s.message();
  EXPECT_FALSE(c.held());
  EXPECT_EQ(limiter.running(), 2u);
  // Another key still gets in: one user's calls leave room for the others.
  CallLimiter::Slot d;
  EXPECT_TRUE(limiter.Enter(8, &d).ok());
}

TEST(CallLimiter, TheWholeServerIsBoundedAcrossKeys) {
  CallLimiter limiter(3, 2, "max_peer_calls", "max_peer_calls_per_uid");
  std::vector<CallLimiter::Slot> slots(4);
  ASSERT_TRUE(limiter.Enter(1, &slots[0]).ok());
  ASSERT_TRUE(limiter.Enter(2, &slots[1]).ok());
  ASSERT_TRUE(limiter.Enter(3, &slots[2]).ok());
  Status s = limiter.Enter(4, &slots[3]);
  EXPECT_EQ(s.code(), Status::Code::kResourceExhausted);
  EXPECT_NE(s.message().find("(max_peer_calls=3)"), std::string::npos) << s.message();
  slots[1].Leave();  // a place given back is free for anyone
  EXPECT_TRUE(limiter.Enter(4, &slots[3]).ok());
  EXPECT_EQ(limiter.running(), 3u);
}

TEST(CallLimiter, ASlotGivesItsPlaceBackOnceWhenDestroyedOrMoved) {
  CallLimiter limiter(1, 1, "max_peer_calls", "max_peer_calls_per_uid");
  {
    CallLimiter::Slot a;
    ASSERT_TRUE(limiter.Enter(5, &a).ok());
    CallLimiter::Slot b(std::move(a));  // the place moves, it is not doubled
    EXPECT_FALSE(a.held());
    EXPECT_TRUE(b.held());
    b.Leave();
    b.Leave();  // idempotent
    EXPECT_EQ(limiter.running(), 0u);
    ASSERT_TRUE(limiter.Enter(5, &a).ok());
  }
  EXPECT_EQ(limiter.running(), 0u);
  CallLimiter::Slot c;
  EXPECT_TRUE(limiter.Enter(6, &c).ok());
}

TEST(CallLimiter, AShareOfZeroOrAboveTheTotalIsTheTotal) {
  EXPECT_EQ(CallLimiter(8, 0, "x", "y").per_key(), 8u);
  EXPECT_EQ(CallLimiter(8, 20, "x", "y").per_key(), 8u);
  EXPECT_EQ(CallLimiter(8, 4, "x", "y").per_key(), 4u);
}

}  // namespace
}  // namespace tce
