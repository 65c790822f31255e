#include "cache/job_owners.h"

#include <gtest/gtest.h>

namespace tce {
namespace {

TEST(JobOwners, TheOwnersGroupGoesWithItAndAnAdministratorTakesNothing) {
  JobOwners owners;
  ASSERT_TRUE(owners.Claim(1001, "j", "save", 100).ok());
  ASSERT_TRUE(owners.Claim(0, "j", "set the ring", 0).ok());  // root acts on it: still 1001's
  uid_t uid = 0;
  gid_t gid = 0;
  ASSERT_TRUE(owners.Owner("j", &uid, &gid));
  EXPECT_EQ(uid, 1001u);
  EXPECT_EQ(gid, 100u);
  EXPECT_FALSE(owners.Claim(1002, "j", "save", 200).ok());
  EXPECT_FALSE(owners.Owner("other", &uid, &gid));
}

TEST(JobOwners, AnOwnerAPeerVouchedForHasNoGroupUntilItsOwnClaim) {
  JobOwners owners;
  owners.Restore("j", 1001);  // a ring member named the job's uid
  uid_t uid = 0;
  gid_t gid = 0;
  ASSERT_TRUE(owners.Owner("j", &uid, &gid));
  EXPECT_EQ(gid, JobOwners::kNoGid);
  ASSERT_TRUE(owners.Claim(0, "j", "set the ring", 0).ok());  // root's group is not the owner's
  ASSERT_TRUE(owners.Owner("j", &uid, &gid));
  EXPECT_EQ(gid, JobOwners::kNoGid);
  ASSERT_TRUE(owners.Claim(1001, "j", "set the ring", 100).ok());
  ASSERT_TRUE(owners.Owner("j", &uid, &gid));
  EXPECT_EQ(gid, 100u);
  ASSERT_TRUE(owners.Claim(1001, "j", "save", 300).ok());  // the first group seen stays
  ASSERT_TRUE(owners.Owner("j", &uid, &gid));
  EXPECT_EQ(gid, 100u);
}

TEST(JobOwners, AUsersFileRestoredWinsOverRootsWithItsGroup) {
  JobOwners owners;
  owners.Restore("j", 0, 0);
  owners.Restore("j", 1001, 100);
  uid_t uid = 0;
  gid_t gid = 0;
  ASSERT_TRUE(owners.Owner("j", &uid, &gid));
  EXPECT_EQ(uid, 1001u);
  EXPECT_EQ(gid, 100u);
  owners.Restore("j", 0, 0);
  ASSERT_TRUE(owners.Owner("j", &uid, &gid));
  EXPECT_EQ(uid, 1001u);
}

}  // namespace
}  // namespace tce
