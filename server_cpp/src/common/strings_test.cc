#include "common/strings.h"

#include <gtest/gtest.h>

namespace tce {

TEST(ParseSize, Units) {
  uint64_t b;
  ASSERT_TRUE(ParseSize("4096", &b)); EXPECT_EQ(b, 4096u);
  ASSERT_TRUE(ParseSize("512MiB", &b)); EXPECT_EQ(b, 512u << 20);
  ASSERT_TRUE(ParseSize("4GiB", &b)); EXPECT_EQ(b, uint64_t{4} << 30);
  ASSERT_TRUE(ParseSize("1.5GB", &b)); EXPECT_EQ(b, 1500000000u);
  ASSERT_TRUE(ParseSize("2k", &b)); EXPECT_EQ(b, 2048u);
  EXPECT_FALSE(ParseSize("", &b));
  EXPECT_FALSE(ParseSize("lots", &b));
  EXPECT_FALSE(ParseSize("-1", &b));
  EXPECT_FALSE(ParseSize("3 parsecs", &b));
}

TEST(HumanBytes, Formats) {
  EXPECT_EQ(HumanBytes(12), "12 B");
  EXPECT_EQ(HumanBytes(1536 << 20), "1.5 GiB");
}

TEST(ValidatePath, AcceptsNormalAbsolutePaths) {
  EXPECT_TRUE(ValidatePath("/ckpt/global_step10/mp_rank_00_model_states.pt").ok());
  EXPECT_TRUE(ValidatePath("/x").ok());
}

TEST(ValidatePath, RejectsEachBadForm) {
  for (const char* p : {"", "rel/x.pt", "/a/../b", "/a/./b", "/a/b/", "/a//b", "/a/\x01"}) {
    Status s = ValidatePath(p);
    EXPECT_EQ(s.code(), Status::Code::kInvalidArgument) << p;
  }
  EXPECT_NE(ValidatePath("/a/../b").message().find(".."), std::string::npos);
  EXPECT_TRUE(ValidatePath(std::string(5000, 'a').insert(0, "/")).message().find("4096") !=
              std::string::npos);
}

TEST(ValidateName, JobAndTag) {
  EXPECT_TRUE(ValidateName("job", "train-7", false, true).ok());
  EXPECT_FALSE(ValidateName("job", "", false, true).ok());
  EXPECT_TRUE(ValidateName("tag", "", true, false).ok());
  EXPECT_FALSE(ValidateName("tag", "a/b", true, false).ok());
  EXPECT_FALSE(ValidateName("job", std::string(256, 'j'), false, true).ok());
}

}  // namespace tce
