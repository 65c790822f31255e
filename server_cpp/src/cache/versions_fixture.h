// The fixture of the published-versions gtests (versions_test.cc,
// cache_follow_test.cc): a Cache on a ManualClock, a session of the owner
// of job "job", and how it saves and publishes. Test code only.
#pragma once

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "cache/cache.h"
#include "common/manual_clock.h"

namespace tce {
namespace versions_testing {

constexpr uid_t kOwner = 1000, kReader = 1001, kStranger = 1002;
constexpr gid_t kReaders = 2000;
constexpr auto kNoDeadline = Clock::TimePoint::max();

inline TagInfo Tag(const std::string& job, const std::string& name, std::vector<TagFile> files) {
  TagInfo t;
  t.job = job;
  t.tag = name;
  t.world_size = 1;
  t.files = std::move(files);
  return t;
}

class VersionsTest : public ::testing::Test {
 protected:
  // Version leases of 60 s unless named, at most 120 s; `readers` read every job.
  explicit VersionsTest(ReadGrants::Ids readers = {}) : cache_([&] {
    CacheOptions o(64 << 20);
    o.clock = &clock_;
    o.limits.version_lease = std::chrono::seconds(60);
    o.limits.version_lease_max = std::chrono::seconds(120);
    o.limits.read_grants = std::move(readers);
    return o;
  }()) {
    owner_ = cache_.sessions()->OpenSession(kOwner, 1, kOwner);
  }

  // Saves `path` (as the owner) with `size` bytes of `fill`; returns its buffer.
  uint64_t Save(const std::string& tag, const std::string& path, uint64_t size) {
    AllocateRequest r{owner_, "job", tag, path, 0, size};
    AllocateResult a;
    EXPECT_TRUE(cache_.Allocate(r, &a).ok());
    FileInfo f;
    EXPECT_TRUE(cache_.Commit(owner_, a.allocation_id, {}, &f).ok());
    return a.buffer_id;
  }
  TagInfo Publish(const std::string& tag, std::vector<TagFile> files) {
    TagInfo out;
    Status s = cache_.CommitTag(owner_, Tag("job", tag, std::move(files)), &out);
    EXPECT_TRUE(s.ok()) << s.ToString();
    return out;
  }

  ManualClock clock_;
  Cache cache_;
  std::string owner_;
};

}  // namespace versions_testing
}  // namespace tce
