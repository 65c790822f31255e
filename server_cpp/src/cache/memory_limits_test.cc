#include "cache/memory_limits.h"

#include <gtest/gtest.h>

#include "common/testing.h"
#include <stdlib.h>

#include <filesystem>
#include <fstream>

namespace tce {
namespace fs = std::filesystem;

class FakeRoot : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = MakeTempDir("tce-limits");
    Write("proc/meminfo", "MemTotal:       16384000 kB\nMemFree:  1 kB\n");
  }
  void TearDown() override { fs::remove_all(root_); }
  void Write(const std::string& rel, const std::string& text) {
    fs::path p = fs::path(root_) / rel;
    fs::create_directories(p.parent_path());
    std::ofstream(p) << text;
  }
  std::string root_;
};

TEST_F(FakeRoot, NoCgroupFileUsesHalfOfRam) {
  MemoryLimits m = DetectMemoryLimits(root_);
  EXPECT_EQ(m.mem_total, 16384000ull * 1024);
  EXPECT_EQ(m.cgroup_limit, 0u);
  EXPECT_EQ(AutoBudget(m), m.mem_total / 2);
}

TEST_F(FakeRoot, CgroupV2Limit) {
  Write("proc/self/cgroup", "0::/kubepods/pod1/ctr\n");
  Write("sys/fs/cgroup/kubepods/pod1/ctr/memory.max", "max\n");
  Write("sys/fs/cgroup/kubepods/pod1/memory.max", "8589934592\n");
  MemoryLimits m = DetectMemoryLimits(root_);
  EXPECT_EQ(m.cgroup_limit, 8589934592ull);
  EXPECT_EQ(AutoBudget(m), 8589934592ull / 10 * 9);
}

TEST_F(FakeRoot, CgroupV2Unlimited) {
  Write("proc/self/cgroup", "0::/\n");
  Write("sys/fs/cgroup/memory.max", "max\n");
  EXPECT_EQ(DetectMemoryLimits(root_).cgroup_limit, 0u);
}

TEST_F(FakeRoot, CgroupV1Limit) {
  Write("proc/self/cgroup", "12:cpu,cpuacct:/a\n5:memory:/docker/abc\n");
  Write("sys/fs/cgroup/memory/docker/abc/memory.limit_in_bytes", "4294967296\n");
  EXPECT_EQ(DetectMemoryLimits(root_).cgroup_limit, 4294967296ull);
}

TEST_F(FakeRoot, CgroupV1NoLimitSentinel) {
  Write("proc/self/cgroup", "5:memory:/docker/abc\n");
  Write("sys/fs/cgroup/memory/docker/abc/memory.limit_in_bytes", "9223372036854771712\n");
  EXPECT_EQ(DetectMemoryLimits(root_).cgroup_limit, 0u);
}

}  // namespace tce
