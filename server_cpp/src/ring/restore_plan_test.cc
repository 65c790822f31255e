#include "ring/restore_plan.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <map>

#include "common/manual_clock.h"

namespace tce {
namespace {

using namespace std::chrono_literals;

std::vector<ListedObject> Files(std::vector<std::pair<std::string, uint64_t>> in) {
  std::vector<ListedObject> out;
  for (auto& [k, s] : in) out.push_back({k, s});
  return out;
}

TEST(AssignByBytes, BalancesBytesLargestFirst) {
  // One 4-unit model file and six 2-unit shards over three nodes.
  auto files = Files({{"/t/model", 4}, {"/t/s0", 2}, {"/t/s1", 2}, {"/t/s2", 2},
                      {"/t/s3", 2}, {"/t/s4", 2}, {"/t/s5", 2}});
  std::vector<size_t> owner = AssignByBytes(files, 3);
  std::vector<uint64_t> load(3, 0);
  for (size_t i = 0; i < files.size(); ++i) load[owner[i]] += files[i].size;
  EXPECT_EQ(load, (std::vector<uint64_t>{6, 6, 4}));
  EXPECT_EQ(owner[0], 0u);  // the largest goes first, to the lowest node
}

TEST(AssignByBytes, IsTheSameForAnyOrderOfTheListing) {
  auto files = Files({{"/t/a", 7}, {"/t/b", 3}, {"/t/c", 3}, {"/t/d", 1}, {"/t/e", 9}});
  std::vector<size_t> first = AssignByBytes(files, 2);
  std::map<std::string, size_t> by_path;
  for (size_t i = 0; i < files.size(); ++i) by_path[files[i].key] = first[i];
  std::reverse(files.begin(), files.end());
  std::vector<size_t> second = AssignByBytes(files, 2);
  for (size_t i = 0; i < files.size(); ++i) EXPECT_EQ(second[i], by_path[files[i].key]) << files[i].key;
}

TEST(AssignByBytes, NoNodesOrNoFiles) {
  EXPECT_TRUE(AssignByBytes({}, 3).empty());
  EXPECT_EQ(AssignByBytes(Files({{"/t/a", 1}}), 0), std::vector<size_t>{0});
}

class RestorePlansTest : public ::testing::Test {
 protected:
  RestorePlansTest()
      : plans_([this](const std::string&, const std::string& dir, std::vector<ListedObject>* out) {
          ++lists_;
          if (dir != "/t") return Status::NotFound(dir);
          *out = listing_;
          return Status::OK();
        }, &clock_, 30s, 10s) {}
  ManualClock clock_;
  std::vector<ListedObject> listing_ = Files({{"/t/big", 10}, {"/t/small", 1}, {"/t/mid", 5}});
  int lists_ = 0;
  RestorePlans plans_;
  const std::vector<std::string> nodes_{"n0:1", "n1:1", "n2:1"};
};

TEST_F(RestorePlansTest, OwnersFollowTheListingAndThePlanIsKept) {
  EXPECT_EQ(plans_.OwnerOf("job", nodes_, "/t/big"), "n0:1");
  EXPECT_EQ(plans_.OwnerOf("job", nodes_, "/t/mid"), "n1:1");
  EXPECT_EQ(plans_.OwnerOf("job", nodes_, "/t/small"), "n2:1");
  EXPECT_EQ(lists_, 1);  // one listing for the directory
  clock_.Advance(31s);
  EXPECT_EQ(plans_.OwnerOf("job", nodes_, "/t/big"), "n0:1");
  EXPECT_EQ(lists_, 2);  // made again after its time
}

TEST_F(RestorePlansTest, ANodeDownHasItsShareGoToTheOthersForAWhile) {
  plans_.MarkDown("job", "n0:1");
  const std::string big = plans_.OwnerOf("job", nodes_, "/t/big");
  EXPECT_EQ(big, "n1:1");  // planned over n1, n2
  EXPECT_NE(plans_.OwnerOf("job", nodes_, "/t/mid"), "n0:1");
  EXPECT_NE(plans_.OwnerOf("job", nodes_, "/t/small"), "n0:1");
  EXPECT_EQ(plans_.OwnerOf("other", nodes_, "/t/big"), "n0:1");  // only for that job
  clock_.Advance(11s);
  EXPECT_EQ(plans_.OwnerOf("job", nodes_, "/t/big"), "n0:1");  // back in the plans
}

TEST_F(RestorePlansTest, ANodeThatStoppedAnsweringIsAskedNothingUntilItsTimeIsUp) {
  EXPECT_FALSE(plans_.IsDown("job", "n2:1"));
  plans_.MarkDown("job", "n2:1");
  EXPECT_TRUE(plans_.IsDown("job", "n2:1"));
  EXPECT_FALSE(plans_.IsDown("other", "n2:1"));  // for that job only
  clock_.Advance(9s);
  plans_.MarkDown("job", "n2:1");  // another load found it silent too: from now on
  clock_.Advance(9s);
  EXPECT_TRUE(plans_.IsDown("job", "n2:1"));
  clock_.Advance(1s);
  EXPECT_FALSE(plans_.IsDown("job", "n2:1"));
}

TEST_F(RestorePlansTest, AFileTheListingMissesIsPlacedByItsNameTheSameEverywhere) {
  RestorePlans other([](const std::string&, const std::string&, std::vector<ListedObject>*) {
    return Status::Unavailable("storage down");
  }, &clock_);
  const std::string a = plans_.OwnerOf("job", nodes_, "/t/new");
  const std::string b = other.OwnerOf("job", nodes_, "/t/new");
  EXPECT_EQ(a, b);
  EXPECT_NE(std::find(nodes_.begin(), nodes_.end(), a), nodes_.end());
}

TEST_F(RestorePlansTest, EveryNodeDownMeansNoOwner) {
  for (const std::string& n : nodes_) plans_.MarkDown("job", n);
  EXPECT_EQ(plans_.OwnerOf("job", nodes_, "/t/big"), "");
}

}  // namespace
}  // namespace tce
