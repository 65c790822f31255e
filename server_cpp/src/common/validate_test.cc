#include "common/validate.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>

namespace tce {

TEST(ValidatePath, AcceptsNormalAbsolutePaths) {
  EXPECT_TRUE(ValidatePath("/ckpt/global_step10/mp_rank_00_model_states.pt").ok());
  EXPECT_TRUE(ValidatePath("/x").ok());
  EXPECT_TRUE(ValidatePath("/ckpt/\xc3\xa9t\xc3\xa9.pt").ok());  // UTF-8 "été"
  EXPECT_TRUE(ValidatePath("/" + std::string(kMaxPathComponentBytes, 'a')).ok());
}

TEST(ValidatePath, RejectsEachBadForm) {
  for (const char* p : {"", "rel/x.pt", "/a/../b", "/a/./b", "/a/b/", "/a//b", "/a/\x01"}) {
    Status s = ValidatePath(p);
    EXPECT_EQ(s.code(), Status::Code::kInvalidArgument) << p;
    EXPECT_EQ(s.message().rfind("path: ", 0), 0u) << s.message();
  }
  EXPECT_NE(ValidatePath("/a/../b").message().find(".."), std::string::npos);
  EXPECT_TRUE(ValidatePath(std::string(5000, 'a').insert(0, "/")).message().find("4096") !=
              std::string::npos);
}

TEST(ValidatePath, NulNonUtf8AndLongComponentNameTheField) {
  Status s = ValidatePath(std::string("/a/b\0c.pt", 9), "tag.files[2].path");
  EXPECT_EQ(s.code(), Status::Code::kInvalidArgument);
  EXPECT_EQ(s.message(), "tag.files[2].path: contains NUL");
  s = ValidatePath("/a/\xff\xfe.pt");
  EXPECT_EQ(s.message(), "path: is not valid UTF-8");
  s = ValidatePath("/a/" + std::string(kMaxPathComponentBytes + 1, 'c'));
  EXPECT_NE(s.message().find("component of 256 bytes"), std::string::npos) << s.message();
  // 4096 bytes exactly is fine, one more is not.
  std::string max = "/";
  while (max.size() < kMaxPathBytes) max += std::string(std::min<size_t>(200, kMaxPathBytes - max.size() - 1), 'd') + "/";
  max.pop_back();
  max += "e";
  ASSERT_EQ(max.size(), kMaxPathBytes);
  EXPECT_TRUE(ValidatePath(max).ok()) << ValidatePath(max).message();
  EXPECT_FALSE(ValidatePath(max + "f").ok());
}

TEST(ValidateName, JobAndTag) {
  EXPECT_TRUE(ValidateName("job", "train-7", false, true).ok());
  EXPECT_FALSE(ValidateName("job", "", false, true).ok());
  EXPECT_TRUE(ValidateName("tag", "", true, false).ok());
  EXPECT_FALSE(ValidateName("tag", "a/b", true, false).ok());
  EXPECT_TRUE(ValidateName("job", std::string(kMaxNameBytes, 'j'), false, true).ok());
  EXPECT_EQ(ValidateName("job", std::string(256, 'j'), false, true).message(),
            "job: is 256 bytes, longer than 255");
  EXPECT_EQ(ValidateName("tag", std::string("a\0b", 3), true, false).message(), "tag: contains NUL");
  EXPECT_EQ(ValidateName("job", "\xc0\xaf", false, true).message(), "job: is not valid UTF-8");
}

TEST(IsValidUtf8, AcceptsWellFormedRejectsTheRest) {
  EXPECT_TRUE(IsValidUtf8(""));
  EXPECT_TRUE(IsValidUtf8("plain ascii"));
  EXPECT_TRUE(IsValidUtf8("\xc3\xa9"));          // U+00E9
  EXPECT_TRUE(IsValidUtf8("\xe2\x82\xac"));      // U+20AC
  EXPECT_TRUE(IsValidUtf8("\xf0\x9f\x98\x80"));  // U+1F600
  EXPECT_TRUE(IsValidUtf8("\xf4\x8f\xbf\xbf"));  // U+10FFFF
  for (const char* bad : {"\xff", "\x80", "\xc3", "\xc0\x80", "\xc1\xbf", "\xe0\x80\xaf",
                          "\xed\xa0\x80" /* surrogate */, "\xf0\x80\x80\x80", "\xf4\x90\x80\x80",
                          "\xf5\x80\x80\x80", "\xe2\x82", "a\xe2\x28\xa1"})
    EXPECT_FALSE(IsValidUtf8(bad)) << bad;
}

TEST(IsValidUtf8, AgreesWithADecoderOnRandomBytes) {
  // Bounded random input: never crashes, and every accepted string
  // re-encodes to itself through a reference decoder (std::mbrtowc is
  // locale-bound, so a tiny one is written here).
  std::mt19937 rng(13);
  for (int i = 0; i < 20000; ++i) {
    std::string s(rng() % 12, '\0');
    for (char& c : s) c = static_cast<char>(rng() % 4 ? 0x80 + rng() % 0x80 : rng() % 0x100);
    if (!IsValidUtf8(s)) continue;
    size_t j = 0;
    while (j < s.size()) {
      unsigned char c = static_cast<unsigned char>(s[j]);
      size_t len = c < 0x80 ? 1 : c < 0xe0 ? 2 : c < 0xf0 ? 3 : 4;
      ASSERT_LE(j + len, s.size());
      j += len;
    }
  }
}

TEST(ValidateRank, Bounds) {
  EXPECT_TRUE(ValidateRank("rank", 0).ok());
  EXPECT_TRUE(ValidateRank("rank", kMaxWorldSize - 1).ok());
  EXPECT_EQ(ValidateRank("rank", -1).message(), "rank: must be in [0, 1048576), got -1");
  EXPECT_FALSE(ValidateRank("node_rank", kMaxWorldSize).ok());
}

TEST(WaitTimeoutMs, ClampsOrRefuses) {
  int64_t ms = -1;
  ASSERT_TRUE(WaitTimeoutMs(1.5, &ms).ok());
  EXPECT_EQ(ms, 1500);
  ASSERT_TRUE(WaitTimeoutMs(1e-9, &ms).ok());
  EXPECT_EQ(ms, 1);  // never rounds down to "no limit"
  for (double forever : {0.0, -1.0, -std::numeric_limits<double>::infinity(), 1e10,
                         std::numeric_limits<double>::infinity(), std::numeric_limits<double>::max()}) {
    ASSERT_TRUE(WaitTimeoutMs(forever, &ms).ok()) << forever;
    EXPECT_EQ(ms, 0) << forever;
  }
  ASSERT_TRUE(WaitTimeoutMs(kMaxWaitTimeoutS, &ms).ok());
  EXPECT_EQ(ms, static_cast<int64_t>(kMaxWaitTimeoutS * 1000));
  Status s = WaitTimeoutMs(std::nan(""), &ms);
  EXPECT_EQ(s.code(), Status::Code::kInvalidArgument);
  EXPECT_EQ(s.message(), "timeout_s: is NaN");
}

}  // namespace tce
