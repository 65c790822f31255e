// Detects how much memory the server may use: its cgroup's limit (v2, else
// v1) or the machine's RAM, and the huge pages the kernel offers. File reads are rooted at `root` ("/" in
// production) so tests can use a fake tree. Any thread.
#pragma once

#include <cstdint>
#include <string>

namespace tce {

struct MemoryLimits {
  uint64_t cgroup_limit = 0;    // 0: none found
  uint64_t mem_total = 0;       // from /proc/meminfo
  uint64_t mem_available = 0;   // MemAvailable, when read
  uint64_t hugepages_free = 0;  // HugePages_Free: reserved 2 MiB pages not in use
  std::string shmem_thp;        // the [selected] word of transparent_hugepage/shmem_enabled
};

MemoryLimits DetectMemoryLimits(const std::string& root);

// The default budget: 90% of the cgroup limit, else 50% of RAM.
uint64_t AutoBudget(const MemoryLimits& limits);

}  // namespace tce
