// The fixture of the Cache's own gtests (cache_test.cc,
// cache_access_test.cc): a Cache of a given budget, on the real clock or a
// ManualClock, and how a client allocates, maps and commits a file in it.
// Test code only.
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <string>
#include <utility>
#include <vector>

#include "cache/cache.h"
#include "common/manual_clock.h"

namespace tce {
namespace cache_testing {

constexpr uint64_t kMiB = 1 << 20;

// Every file of `job` in `tag` ("": every job, every tag), and the complete
// tags of `job`, as uid 0 lists them (an administrator unless the Cache was
// made with root_is_admin false): what a test looks at.
inline std::vector<FileInfo> Files(Cache& cache, const std::string& job, const std::string& tag) {
  const std::string admin = cache.sessions()->OpenSession(0, getpid());
  std::vector<FileInfo> out;
  Status s = cache.List(admin, job, tag, &out);
  EXPECT_TRUE(s.ok()) << s.ToString();
  cache.sessions()->CloseSession(admin);
  return out;
}
inline std::vector<TagInfo> Tags(Cache& cache, const std::string& job) {
  const std::string admin = cache.sessions()->OpenSession(0, getpid());
  std::vector<TagInfo> out;
  Status s = cache.ListTags(admin, job, &out);
  EXPECT_TRUE(s.ok()) << s.ToString();
  cache.sessions()->CloseSession(admin);
  return out;
}

class CacheTest : public ::testing::Test {
 protected:
  // With `manual_clock`, the cache's time is clock_'s (moved by the test).
  explicit CacheTest(uint64_t budget = 64 * kMiB, bool manual_clock = false)
      : CacheTest(budget, manual_clock, SessionLimits()) {}
  CacheTest(uint64_t budget, bool manual_clock, const SessionLimits& limits)
      : cache_([&] {
          CacheOptions o(budget);
          o.clock = manual_clock ? static_cast<Clock*>(&clock_) : Clock::Real();
          o.limits = limits;
          return o;
        }()) {}

  AllocateResult Alloc(const std::string& session, const std::string& path, uint64_t size,
                       Status* status = nullptr, const std::string& job = "job") {
    AllocateRequest r{session, job, "tag", path, 0, size};
    AllocateResult out;
    Status s = cache_.Allocate(r, &out);
    if (status) *status = s;
    else EXPECT_TRUE(s.ok()) << s.ToString();
    return out;
  }
  // Receives the fd like a client would (which registers us as a mapper).
  int Fd(const std::string& session, uint64_t buffer, bool* writable = nullptr) {
    int fd = -1;
    bool w = false;
    uint64_t cap = 0;
    Status s = cache_.sessions()->FdFor(session, buffer, &fd, &w, &cap);
    EXPECT_TRUE(s.ok()) << s.ToString();
    if (writable) *writable = w;
    return fd;
  }
  FileInfo Commit(const std::string& session, uint64_t id) {
    FileInfo f;
    Status s = cache_.Commit(session, id, {}, &f);
    EXPECT_TRUE(s.ok()) << s.ToString();
    return f;
  }
  void Save(const std::string& session, const std::string& path, uint64_t size, const std::string& job = "job") {
    AllocateResult a = Alloc(session, path, size, nullptr, job);
    close(Fd(session, a.buffer_id));
    Commit(session, a.allocation_id);
  }

  ManualClock clock_;  // before cache_, which may use it
  Cache cache_;
};

class SmallCacheTest : public CacheTest {
 protected:
  SmallCacheTest() : CacheTest(10 * kMiB) {}
};

// A tag of job "job" (`world` ranks) listing `files`.
inline TagInfo Tag(const std::string& name, std::vector<TagFile> files, int32_t world = 2) {
  TagInfo t;
  t.job = "job";
  t.tag = name;
  t.world_size = world;
  t.files = std::move(files);
  return t;
}

}  // namespace cache_testing
}  // namespace tce
