#include "cache/memory_backing.h"

#include <gtest/gtest.h>
#include <sys/stat.h>

#include <cstdlib>
#include <fstream>
#include <string>

#include "common/testing.h"

namespace tce {
namespace {

MemoryLimits With(uint64_t free_pages, const std::string& thp) {
  MemoryLimits l;
  l.hugepages_free = free_pages;
  l.shmem_thp = thp;
  return l;
}

TEST(MemoryBacking, AutoPrefersHugetlbThenThpThen4k) {
  Backing b;
  std::string why;
  ASSERT_TRUE(ResolveBacking("auto", With(600, "never"), &b, &why).ok());
  EXPECT_EQ(b, Backing::kHugetlb);
  EXPECT_NE(why.find("600 free"), std::string::npos) << why;
  ASSERT_TRUE(ResolveBacking("auto", With(0, "advise"), &b, &why).ok());
  EXPECT_EQ(b, Backing::kThp);
  ASSERT_TRUE(ResolveBacking("auto", With(0, "never"), &b, &why).ok());
  EXPECT_EQ(b, Backing::k4k);
  EXPECT_NE(why.find("fell back to 4 KiB pages"), std::string::npos) << why;
  ASSERT_TRUE(ResolveBacking("4k", With(600, "always"), &b, &why).ok());
  EXPECT_EQ(b, Backing::k4k);
}

TEST(MemoryBacking, AnExplicitBackingTheMachineLacksIsAClearError) {
  Backing b;
  std::string why;
  Status s = ResolveBacking("hugetlb", With(0, "always"), &b, &why);
  EXPECT_EQ(s.code(), Status::Code::kFailedPrecondition);
  EXPECT_NE(s.message().find("/proc/sys/vm/nr_hugepages"), std::string::npos) << s.message();
  s = ResolveBacking("thp", With(100, "never"), &b, &why);
  EXPECT_EQ(s.code(), Status::Code::kFailedPrecondition);
  EXPECT_NE(s.message().find("shmem_enabled"), std::string::npos) << s.message();
  s = ResolveBacking("2m", With(100, "always"), &b, &why);
  EXPECT_EQ(s.code(), Status::Code::kInvalidArgument);
  EXPECT_FALSE(ValidBackingSetting("huge"));
  EXPECT_TRUE(ValidBackingSetting("thp"));
}

TEST(MemoryBacking, HugetlbCapacitiesAreWholeHugePages) {
  EXPECT_EQ(RoundForBacking(1, Backing::kHugetlb), kHugePage);
  EXPECT_EQ(RoundForBacking(kHugePage, Backing::kHugetlb), kHugePage);
  EXPECT_EQ(RoundForBacking(kHugePage + 4096, Backing::kHugetlb), 2 * kHugePage);
  EXPECT_EQ(RoundForBacking(kHugePage + 4096, Backing::k4k), kHugePage + 4096);
  EXPECT_EQ(RoundForBacking(12345, Backing::kThp), 12345u);
}

TEST(MemoryBacking, LimitsReadTheFreeHugePagesAndShmemThp) {
  const std::string root = MakeTempDir("tce-limits");
  ASSERT_EQ(system(("mkdir -p " + root + "/proc " + root + "/sys/kernel/mm/transparent_hugepage").c_str()), 0);
  std::ofstream(root + "/proc/meminfo") << "MemTotal:       16384000 kB\nMemAvailable:    8000000 kB\n"
                                           "HugePages_Total:    1100\nHugePages_Free:     1037\n"
                                           "Hugepagesize:       2048 kB\n";
  std::ofstream(root + "/sys/kernel/mm/transparent_hugepage/shmem_enabled")
      << "always within_size [advise] never deny force\n";
  MemoryLimits l = DetectMemoryLimits(root);
  EXPECT_EQ(l.mem_total, 16384000ull * 1024);
  EXPECT_EQ(l.mem_available, 8000000ull * 1024);
  EXPECT_EQ(l.hugepages_free, 1037u);
  EXPECT_EQ(l.shmem_thp, "advise");
  ASSERT_EQ(system(("rm -rf " + root).c_str()), 0);
}

}  // namespace
}  // namespace tce
