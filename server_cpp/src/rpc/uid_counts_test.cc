// UidCounts: each uid reaches its own cap, never another's.
#include "rpc/uid_counts.h"

#include <gtest/gtest.h>

namespace tce {
namespace {

TEST(UidCounts, AUidAtItsCapIsRefusedWhileOthersStillTake) {
  UidCounts c(2, "sessions", "max_sessions_per_uid");
  ASSERT_TRUE(c.Take(1001).ok());
  ASSERT_TRUE(c.Take(1001).ok());
  Status s = c.Take(1001);
  EXPECT_EQ(s.code(), Status::Code::kResourceExhausted);
  EXPECT_EQ(s.message(), "uid 1001 holds 2 sessions (max_sessions_per_uid)");
  EXPECT_EQ(c.held(1001), 2u);  // the refusal counted nothing
  ASSERT_TRUE(c.Take(1002).ok());
  ASSERT_TRUE(c.Take(0).ok());  // root is a uid like any other
  ASSERT_TRUE(c.Take(0).ok());
  EXPECT_EQ(c.Take(0).code(), Status::Code::kResourceExhausted);
  // One goes: its uid may take one more.
  c.Give(1001);
  EXPECT_EQ(c.held(1001), 1u);
  EXPECT_TRUE(c.Take(1001).ok());
  EXPECT_EQ(c.Take(1001).code(), Status::Code::kResourceExhausted);
}

TEST(UidCounts, GivingWhatWasNeverTakenChangesNothing) {
  UidCounts c(1, "range buffers", "max_range_buffers_per_uid");
  c.Give(7);
  EXPECT_EQ(c.held(7), 0u);
  ASSERT_TRUE(c.Take(7).ok());
  EXPECT_EQ(c.Take(7).message(), "uid 7 holds 1 range buffers (max_range_buffers_per_uid)");
  c.Give(7);
  c.Give(7);
  EXPECT_EQ(c.held(7), 0u);
  EXPECT_TRUE(c.Take(7).ok());
}

}  // namespace
}  // namespace tce
