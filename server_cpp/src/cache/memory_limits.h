// Detects how much memory the server may use: its cgroup's limit (v2, else
// v1) or the machine's RAM. File reads are rooted at `root` ("/" in
// production) so tests can use a fake tree. Any thread.
#pragma once

#include <cstdint>
#include <string>

namespace tce {

struct MemoryLimits {
  uint64_t cgroup_limit = 0;  // 0: none found
  uint64_t mem_total = 0;     // from /proc/meminfo
};

MemoryLimits DetectMemoryLimits(const std::string& root);

// The default budget: 90% of the cgroup limit, else 50% of RAM.
uint64_t AutoBudget(const MemoryLimits& limits);

}  // namespace tce
