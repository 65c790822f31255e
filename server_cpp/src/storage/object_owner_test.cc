#include "storage/object_owner.h"

#include <gtest/gtest.h>

namespace tce {
namespace {

ObjectId Owned(uint32_t uid) {
  ObjectId o;
  o.exists = o.owned = true;
  o.owner = uid;
  return o;
}

TEST(ObjectOwner, ParsesOnlyAPlainDecimalUid) {
  EXPECT_EQ(ParseOwner("0"), 0u);
  EXPECT_EQ(ParseOwner("1001"), 1001u);
  EXPECT_EQ(ParseOwner("4294967294"), 4294967294u);
  for (const char* bad : {"", "4294967295", "99999999999", "-1", "+1", "01", "1 ", "0x10", "1001\n"})
    EXPECT_EQ(ParseOwner(bad), kNoUid) << bad;
}

TEST(ObjectOwner, AnObjectIsItsOwnersAndAnAdministrators) {
  const std::string url = "s3://b/run1/a.pt";
  EXPECT_TRUE(MayUse({1001, false}, Owned(1001), url, "read").ok());
  EXPECT_TRUE(MayUse({0, true}, Owned(1001), url, "delete").ok());
  const Status s = MayUse({1002, false}, Owned(1001), url, "read");
  EXPECT_EQ(s.code(), Status::Code::kPermissionDenied);
  EXPECT_EQ(s.message(), "uid 1002 may not read s3://b/run1/a.pt: it belongs to uid 1001");
  // Root without root_is_admin is a uid like any other.
  EXPECT_EQ(MayUse({0, false}, Owned(1001), url, "replace").code(), Status::Code::kPermissionDenied);
  // An owner the server cannot read is nobody's, not even a job with no owner's.
  EXPECT_EQ(MayUse({kNoUid, false}, Owned(kNoUid), url, "list").message(),
            "a job with no owner may not list s3://b/run1/a.pt: it belongs to an owner this server cannot read");
  // Nothing there, or no owner recorded: anyone's.
  EXPECT_TRUE(MayUse({1002, false}, ObjectId(), url, "replace").ok());
  ObjectId unowned;
  unowned.exists = true;
  EXPECT_TRUE(MayUse({1002, false}, unowned, url, "read").ok());
}

}  // namespace
}  // namespace tce
