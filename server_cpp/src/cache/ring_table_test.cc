#include "cache/ring_table.h"

#include <gtest/gtest.h>

namespace tce {
namespace {

TEST(RingTable, ChecksWhatAClientNames) {
  EXPECT_TRUE(RingTable::Check("j", 1, {"a:1", "b:2"}).ok());
  EXPECT_EQ(RingTable::Check("", 0, {"a:1"}).message(), "a ring needs a job");
  EXPECT_EQ(RingTable::Check("j", 0, {}).message(), "a ring needs at least one endpoint");
  EXPECT_EQ(RingTable::Check("j", 2, {"a:1", "b:2"}).message(), "node_rank 2 is outside the 2-node ring");
  EXPECT_EQ(RingTable::Check("j", 0, {"a:1", "nocolon"}).message(),
            "ring endpoint must be host:port, got 'nocolon'");
}

TEST(RingTable, SuccessorPeersAndPredecessorFollowTheRank) {
  RingTable t;
  EXPECT_TRUE(t.Install("j", 1, {"a:1", "b:2", "c:3"}));  // a successor where there was none
  const Ring* r = t.Find("j");
  ASSERT_NE(r, nullptr);
  EXPECT_EQ(r->successor, "c:3");
  EXPECT_EQ(r->Predecessor(), "a:1");
  EXPECT_EQ(r->Peers(), (std::vector<std::string>{"c:3", "a:1"}));
  EXPECT_FALSE(t.Install("j", 1, {"x:9", "b:2", "c:3"}));  // same successor
  EXPECT_TRUE(t.Install("j", 0, {"a:1"}));                // alone now: no successor
  EXPECT_EQ(t.Successor("j"), "");
  EXPECT_EQ(t.Successor("unknown"), "");
  EXPECT_EQ(t.Find("unknown"), nullptr);
}

TEST(RingTable, TheOwnerStaysAcrossReinstalls) {
  RingTable t;
  t.Install("j", 0, {"a:1", "b:2"});
  EXPECT_FALSE(t.Find("j")->has_owner);  // from metadata only
  t.SetOwner("j", 1000, 100);
  t.Install("j", 1, {"a:1", "b:2"});
  EXPECT_TRUE(t.Find("j")->has_owner);
  EXPECT_EQ(t.Find("j")->owner_uid, 1000u);
  std::vector<RingInfo> all = t.All("me:7");
  ASSERT_EQ(all.size(), 1u);
  EXPECT_EQ(all[0].self, "me:7");
  EXPECT_EQ(all[0].node_rank, 1);
}

}  // namespace
}  // namespace tce
