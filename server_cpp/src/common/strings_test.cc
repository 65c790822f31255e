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

}  // namespace tce
