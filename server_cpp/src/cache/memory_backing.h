// What backs the cache's memfd buffers: 4 KiB pages, 2 MiB hugetlb pages
// (MFD_HUGETLB, from the pool the administrator reserved in
// /proc/sys/vm/nr_hugepages) or transparent huge pages of shmem. Fewer pages
// make a client's first mapping of a buffer cheap (page-table setup is what a
// restarted process pays before its first save or restore). Pure functions;
// any thread.
#pragma once

#include <cstdint>
#include <string>

#include "cache/memory_limits.h"
#include "common/status.h"

namespace tce {

enum class Backing { k4k, kHugetlb, kThp };

constexpr uint64_t kHugePage = 2 << 20;

// "4k", "hugetlb", "thp".
const char* BackingName(Backing b);

// Whether `text` is a memory_backing setting: auto, hugetlb, thp or 4k.
bool ValidBackingSetting(const std::string& text);

// The backing the setting asks for on a machine with `limits`:
//  auto:    hugetlb where huge pages are reserved and free, else thp where
//           shmem THP is on (always, within_size, advise, force), else 4k;
//  hugetlb: FAILED_PRECONDITION when no huge page is free;
//  thp:     FAILED_PRECONDITION when shmem THP is off (never, deny) or unknown;
//  4k:      4k.
// `why` says in a sentence what was chosen and why (for the start log).
Status ResolveBacking(const std::string& setting, const MemoryLimits& limits, Backing* out,
                      std::string* why);

// A buffer's capacity rounded to what the backing maps: 2 MiB for hugetlb
// (a hugetlb memfd is sized and mapped in whole huge pages).
uint64_t RoundForBacking(uint64_t capacity, Backing b);

}  // namespace tce
