#include "cache/memory_backing.h"

namespace tce {
namespace {

bool ThpOn(const std::string& mode) {
  return mode == "always" || mode == "within_size" || mode == "advise" || mode == "force";
}

}  // namespace

const char* BackingName(Backing b) {
  switch (b) {
    case Backing::kHugetlb: return "hugetlb";
    case Backing::kThp: return "thp";
    case Backing::k4k: break;
  }
  return "4k";
}

bool ValidBackingSetting(const std::string& text) {
  return text == "auto" || text == "hugetlb" || text == "thp" || text == "4k";
}

Status ResolveBacking(const std::string& setting, const MemoryLimits& limits, Backing* out,
                      std::string* why) {
  const std::string pages = std::to_string(limits.hugepages_free) + " free 2 MiB huge page(s)";
  const std::string thp = "shmem THP is '" + (limits.shmem_thp.empty() ? "unknown" : limits.shmem_thp) + "'";
  if (setting == "4k") {
    *out = Backing::k4k;
    *why = "memory_backing=4k";
  } else if (setting == "hugetlb") {
    if (limits.hugepages_free == 0)
      return Status::FailedPrecondition(
          "memory_backing=hugetlb: no huge page is reserved and free (HugePages_Free is 0); "
          "reserve them with `echo N > /proc/sys/vm/nr_hugepages` (N x 2 MiB)");
    *out = Backing::kHugetlb;
    *why = "memory_backing=hugetlb: " + pages;
  } else if (setting == "thp") {
    if (!ThpOn(limits.shmem_thp))
      return Status::FailedPrecondition(
          "memory_backing=thp: " + thp +
          " in /sys/kernel/mm/transparent_hugepage/shmem_enabled; it must be advise, always, "
          "within_size or force");
    *out = Backing::kThp;
    *why = "memory_backing=thp: " + thp;
  } else if (setting == "auto") {
    if (limits.hugepages_free > 0) {
      *out = Backing::kHugetlb;
      *why = "memory_backing=auto chose hugetlb: " + pages;
    } else if (ThpOn(limits.shmem_thp)) {
      *out = Backing::kThp;
      *why = "memory_backing=auto chose thp: no free huge page, " + thp;
    } else {
      *out = Backing::k4k;
      *why = "memory_backing=auto fell back to 4 KiB pages: no free huge page "
             "(/proc/sys/vm/nr_hugepages) and " + thp;
    }
  } else {
    return Status::InvalidArgument("memory_backing: auto, hugetlb, thp or 4k, not '" + setting + "'");
  }
  return Status::OK();
}

uint64_t RoundForBacking(uint64_t capacity, Backing b) {
  if (b != Backing::kHugetlb) return capacity;
  return (capacity + kHugePage - 1) / kHugePage * kHugePage;
}

}  // namespace tce
