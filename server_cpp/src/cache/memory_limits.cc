#include "cache/memory_limits.h"

#include <cstdlib>
#include <fstream>
#include <sstream>

namespace tce {
namespace {

bool ReadFile(const std::string& path, std::string* out) {
  std::ifstream f(path);
  if (!f) return false;
  std::stringstream ss;
  ss << f.rdbuf();
  *out = ss.str();
  return true;
}

std::string Trim(std::string s) {
  while (!s.empty() && (s.back() == '\n' || s.back() == ' ')) s.pop_back();
  return s;
}

// A limit file's value; 0 when unlimited or unreadable.
uint64_t ReadLimit(const std::string& path) {
  std::string text;
  if (!ReadFile(path, &text)) return 0;
  text = Trim(text);
  if (text.empty() || text == "max") return 0;
  uint64_t v = std::strtoull(text.c_str(), nullptr, 10);
  if (v >= (uint64_t{1} << 60)) return 0;  // cgroup v1's "no limit"
  return v;
}

// The tightest limit from `dir` up to the hierarchy's root.
uint64_t WalkUp(const std::string& mount, std::string rel, const char* file) {
  uint64_t best = 0;
  while (true) {
    uint64_t v = ReadLimit(mount + rel + "/" + file);
    if (v && (!best || v < best)) best = v;
    if (rel.empty() || rel == "/") break;
    size_t slash = rel.rfind('/');
    rel = slash == std::string::npos || slash == 0 ? "" : rel.substr(0, slash);
  }
  return best;
}

}  // namespace

MemoryLimits DetectMemoryLimits(const std::string& root) {
  MemoryLimits out;
  std::string meminfo;
  if (ReadFile(root + "/proc/meminfo", &meminfo)) {
    std::istringstream in(meminfo);
    std::string key;
    uint64_t kb;
    while (in >> key >> kb) {
      if (key == "MemTotal:") out.mem_total = kb * 1024;
      if (key == "MemAvailable:") out.mem_available = kb * 1024;
      if (key == "HugePages_Free:") out.hugepages_free = kb;  // a count, not kB
      in.ignore(1 << 10, '\n');
    }
  }
  std::string thp;
  if (ReadFile(root + "/sys/kernel/mm/transparent_hugepage/shmem_enabled", &thp)) {
    size_t a = thp.find('['), b = thp.find(']');
    if (a != std::string::npos && b != std::string::npos && b > a) out.shmem_thp = thp.substr(a + 1, b - a - 1);
  }
  std::string cgroups;
  if (!ReadFile(root + "/proc/self/cgroup", &cgroups)) return out;
  std::istringstream lines(cgroups);
  std::string line;
  while (std::getline(lines, line)) {
    // "hierarchy-id:controllers:path"
    size_t a = line.find(':'), b = line.find(':', a + 1);
    if (a == std::string::npos || b == std::string::npos) continue;
    std::string controllers = line.substr(a + 1, b - a - 1);
    std::string path = line.substr(b + 1);
    if (path == "/") path.clear();
    uint64_t limit = 0;
    if (line.compare(0, 3, "0::") == 0) {
      limit = WalkUp(root + "/sys/fs/cgroup", path, "memory.max");
    } else if (("," + controllers + ",").find(",memory,") != std::string::npos) {
      limit = WalkUp(root + "/sys/fs/cgroup/memory", path, "memory.limit_in_bytes");
    }
    if (limit && (!out.cgroup_limit || limit < out.cgroup_limit)) out.cgroup_limit = limit;
  }
  return out;
}

uint64_t AutoBudget(const MemoryLimits& limits) {
  if (limits.cgroup_limit) return limits.cgroup_limit / 10 * 9;
  return limits.mem_total / 2;
}

}  // namespace tce
