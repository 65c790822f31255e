#include "cache/cache.h"

#include <gtest/gtest.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>

#include "common/manual_clock.h"

namespace tce {
namespace {

constexpr uint64_t kMiB = 1 << 20;

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
    Status s = cache_.FdFor(session, buffer, &fd, &w, &cap);
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

TEST_F(CacheTest, RoundTripThroughTheServersMemory) {
  std::string s = cache_.OpenSession(getuid(), getpid());
  AllocateResult a = Alloc(s, "/ckpt/a.pt", 10000);
  EXPECT_GE(a.capacity, 10000u);
  bool writable = false;
  int fd = Fd(s, a.buffer_id, &writable);
  EXPECT_TRUE(writable);
  char* m = static_cast<char*>(mmap(nullptr, a.capacity, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0));
  ASSERT_NE(m, MAP_FAILED);
  std::memcpy(m + 100, "checkpoint", 10);
  munmap(m, a.capacity);
  close(fd);
  FileInfo f;
  ASSERT_TRUE(cache_.Commit(s, a.allocation_id, {{"x/data/0", 0, 64, 100, 0}}, &f).ok());
  EXPECT_EQ(f.state, FileState::kCached);

  FileInfo got;
  uint64_t lease;
  std::vector<uint64_t> unmap;
  ASSERT_TRUE(cache_.Lookup(s, "job", "/ckpt/a.pt", true, &got, &lease, &unmap).ok());
  EXPECT_EQ(got.size, 10000u);
  ASSERT_EQ(got.records.size(), 1u);
  EXPECT_EQ(got.records[0].data_offset, 64u);
  EXPECT_NE(lease, 0u);
  int ro = Fd(s, got.buffer_id, &writable);
  EXPECT_FALSE(writable);
  char buf[10];
  ASSERT_EQ(pread(ro, buf, 10, 100), 10);
  EXPECT_EQ(std::memcmp(buf, "checkpoint", 10), 0);
  close(ro);
}

TEST_F(CacheTest, FreedBufferServesTheSameSessionAgain) {
  std::string s = cache_.OpenSession(getuid(), getpid());
  AllocateResult a1 = Alloc(s, "/c/x.pt", 2 * kMiB);
  close(Fd(s, a1.buffer_id));
  Commit(s, a1.allocation_id);
  AllocateResult a2 = Alloc(s, "/c/x.pt", 2 * kMiB);  // a1 still holds the file
  EXPECT_NE(a2.buffer_id, a1.buffer_id);
  close(Fd(s, a2.buffer_id));
  Commit(s, a2.allocation_id);  // replaces: a1's buffer is free
  AllocateResult a3 = Alloc(s, "/c/x.pt", 2 * kMiB + 5);
  EXPECT_EQ(a3.buffer_id, a1.buffer_id);
  CacheStats st = cache_.Stats();
  EXPECT_EQ(st.buffers_created, 2u);
  EXPECT_EQ(st.buffers_reused, 1u);
  EXPECT_EQ(st.files, 1u);
}

TEST_F(CacheTest, BufferMappedByAnotherSessionIsNotHandedOut) {
  std::string a = cache_.OpenSession(1000, 1), b = cache_.OpenSession(1000, 2);
  Save(a, "/c/x.pt", kMiB);
  Save(a, "/c/x.pt", kMiB);  // first buffer is now free but mapped by a
  AllocateResult other = Alloc(b, "/c/y.pt", kMiB);
  EXPECT_EQ(cache_.Stats().buffers_created, 3u);
  EXPECT_EQ(cache_.Stats().buffers_reused, 0u);
  (void)other;
}

TEST_F(SmallCacheTest, FullCacheSaysWhy) {
  std::string s = cache_.OpenSession(1000, 1);
  AllocateResult a = Alloc(s, "/c/a.pt", 6 * kMiB);
  Status st;
  Alloc(s, "/c/b.pt", 6 * kMiB, &st);
  EXPECT_EQ(st.code(), Status::Code::kResourceExhausted);
  EXPECT_NE(st.message().find("cache full: need"), std::string::npos) << st.message();
  EXPECT_NE(st.message().find("pending 6.1 MiB"), std::string::npos) << st.message();
  Alloc(s, "/c/c.pt", 11 * kMiB, &st);
  EXPECT_EQ(st.code(), Status::Code::kResourceExhausted);
  EXPECT_NE(st.message().find("exceeds the cache budget"), std::string::npos);
  (void)a;
}

TEST_F(SmallCacheTest, ReclaimsUnmappedFreeBuffers) {
  std::string s = cache_.OpenSession(1000, 1);
  AllocateResult a = Alloc(s, "/c/a.pt", 6 * kMiB);  // never mapped
  ASSERT_TRUE(cache_.Abort(s, a.allocation_id).ok());
  AllocateResult b = Alloc(s, "/c/b.pt", 3 * kMiB);  // does not fit a's buffer...
  EXPECT_NE(b.buffer_id, a.buffer_id);
  AllocateResult c = Alloc(s, "/c/c.pt", 4 * kMiB);  // ...and a is destroyed for c
  EXPECT_TRUE(c.unmap_buffer_ids.empty());
  EXPECT_EQ(cache_.Stats().buffers, 2u);
}

TEST_F(SmallCacheTest, ReclaimsOurOwnMappedBufferAndSaysUnmap) {
  std::string s = cache_.OpenSession(1000, 1);
  AllocateResult a = Alloc(s, "/c/a.pt", 6 * kMiB);
  close(Fd(s, a.buffer_id));
  ASSERT_TRUE(cache_.Abort(s, a.allocation_id).ok());
  AllocateResult b = Alloc(s, "/c/b.pt", 8 * kMiB);
  EXPECT_EQ(b.unmap_buffer_ids, std::vector<uint64_t>{a.buffer_id});
  EXPECT_EQ(cache_.Stats().buffers, 1u);
}

TEST_F(SmallCacheTest, OtherSessionsBufferIsFreedAtOnceAndUnmappedLater) {
  std::string a = cache_.OpenSession(1000, 1), b = cache_.OpenSession(1000, 2);
  AllocateResult x = Alloc(a, "/c/a.pt", 6 * kMiB);
  int mapped = Fd(a, x.buffer_id);  // a keeps its fd (as it keeps its mapping)
  ASSERT_TRUE(cache_.Abort(a, x.allocation_id).ok());
  // The buffer a maps is retired: its pages go at once, whoever maps it,
  // so b's save has the room now.
  AllocateResult y = Alloc(b, "/c/b.pt", 8 * kMiB);
  EXPECT_NE(y.buffer_id, x.buffer_id);
  struct stat st;
  ASSERT_EQ(fstat(mapped, &st), 0);
  EXPECT_EQ(st.st_blocks, 0);
  close(mapped);
  // a learns it must unmap on its next call, and acknowledges.
  FileInfo f;
  uint64_t lease;
  std::vector<uint64_t> unmap;
  EXPECT_FALSE(cache_.Lookup(a, "job", "/nothing", false, &f, &lease, &unmap).ok());
  EXPECT_EQ(unmap, std::vector<uint64_t>{x.buffer_id});
  ASSERT_TRUE(cache_.Release(a, {}, {x.buffer_id}).ok());
  EXPECT_EQ(cache_.Stats().buffers, 1u);
}

TEST_F(SmallCacheTest, SessionEndForgetsRetiredBuffers) {
  std::string a = cache_.OpenSession(1000, 1), b = cache_.OpenSession(1000, 2);
  AllocateResult x = Alloc(a, "/c/a.pt", 6 * kMiB);
  close(Fd(a, x.buffer_id));
  ASSERT_TRUE(cache_.Abort(a, x.allocation_id).ok());
  Alloc(b, "/c/b.pt", 8 * kMiB);  // retires a's buffer
  EXPECT_EQ(cache_.Stats().buffers, 2u);  // b's, and the retired one a still maps
  EXPECT_EQ(cache_.Stats().used, Buffer::CapacityFor(8 * kMiB));  // the retired one holds nothing
  cache_.CloseSession(a);
  EXPECT_EQ(cache_.Stats().buffers, 1u);
}

TEST_F(CacheTest, LeaseKeepsReplacedBufferUntilReleased) {
  std::string s = cache_.OpenSession(1000, 1);
  Save(s, "/c/x.pt", kMiB);
  FileInfo f;
  uint64_t lease;
  std::vector<uint64_t> unmap;
  ASSERT_TRUE(cache_.Lookup(s, "job", "/c/x.pt", true, &f, &lease, &unmap).ok());
  Save(s, "/c/x.pt", kMiB);  // replaced, but leased: not reusable
  AllocateResult a = Alloc(s, "/c/x.pt", kMiB);
  EXPECT_NE(a.buffer_id, f.buffer_id);
  EXPECT_EQ(cache_.Stats().leases, 1u);
  ASSERT_TRUE(cache_.Abort(s, a.allocation_id).ok());
  EXPECT_EQ(cache_.Release(s, {lease + 100}, {}).code(), Status::Code::kNotFound);
  ASSERT_TRUE(cache_.Release(s, {lease}, {}).ok());
  AllocateResult b = Alloc(s, "/c/y.pt", kMiB);
  AllocateResult c = Alloc(s, "/c/z.pt", kMiB);
  EXPECT_TRUE(b.buffer_id == f.buffer_id || c.buffer_id == f.buffer_id);
}

TEST_F(CacheTest, SessionEndAbortsPendingAllocations) {
  std::string dead = cache_.OpenSession(1000, 1), live = cache_.OpenSession(1000, 2);
  AllocateResult a = Alloc(dead, "/c/x.pt", 3 * kMiB);
  EXPECT_GT(cache_.Stats().pending, 0u);
  cache_.CloseSession(dead);
  CacheStats st = cache_.Stats();
  EXPECT_EQ(st.pending, 0u);
  EXPECT_EQ(st.sessions, 1u);
  EXPECT_TRUE(cache_.List("", "").empty());
  AllocateResult b = Alloc(live, "/c/y.pt", 3 * kMiB);
  EXPECT_EQ(b.buffer_id, a.buffer_id);  // reclaimed and reused
  FileInfo f;
  EXPECT_EQ(cache_.Commit(dead, a.allocation_id, {}, &f).code(), Status::Code::kUnauthenticated);
}

TEST_F(CacheTest, ValidationErrors) {
  std::string s = cache_.OpenSession(1000, 1);
  auto code = [&](const std::string& job, const std::string& path, uint64_t size) {
    AllocateResult out;
    return cache_.Allocate({s, job, "t", path, 0, size}, &out).code();
  };
  EXPECT_EQ(code("j", "/a", 0), Status::Code::kInvalidArgument);
  EXPECT_EQ(code("j", "/a", 65 * kMiB), Status::Code::kResourceExhausted);
  EXPECT_EQ(code("j", "a.pt", 10), Status::Code::kInvalidArgument);
  EXPECT_EQ(code("j", "/a/../b", 10), Status::Code::kInvalidArgument);
  EXPECT_EQ(code("j", "", 10), Status::Code::kInvalidArgument);
  EXPECT_EQ(code("j", "/a/", 10), Status::Code::kInvalidArgument);
  EXPECT_EQ(code("j", "/a\n", 10), Status::Code::kInvalidArgument);
  EXPECT_EQ(code("", "/a", 10), Status::Code::kInvalidArgument);
  AllocateResult out;
  EXPECT_EQ(cache_.Allocate({"nope", "j", "t", "/a", 0, 10}, &out).code(),
            Status::Code::kUnauthenticated);
  EXPECT_EQ(cache_.Stats().buffers, 0u);  // nothing was created for bad requests
}

TEST_F(CacheTest, CommitErrors) {
  std::string s = cache_.OpenSession(1000, 1), other = cache_.OpenSession(1000, 2);
  FileInfo f;
  Status st = cache_.Commit(s, 424242, {}, &f);
  EXPECT_EQ(st.code(), Status::Code::kNotFound);
  EXPECT_EQ(st.message(), "unknown allocation 424242");
  AllocateResult a = Alloc(s, "/c/a.pt", 1000);
  st = cache_.Commit(other, a.allocation_id, {}, &f);
  EXPECT_EQ(st.code(), Status::Code::kPermissionDenied);
  EXPECT_NE(st.message().find("belongs to another session"), std::string::npos);
  // records must lie inside the file, in order, without overlap
  EXPECT_EQ(cache_.Commit(s, a.allocation_id, {{"r", 0, 64, 2000, 0}}, &f).code(),
            Status::Code::kInvalidArgument);
  EXPECT_EQ(cache_.Commit(s, a.allocation_id, {{"r", 64, 64, 10, 0}}, &f).code(),
            Status::Code::kInvalidArgument);
  EXPECT_EQ(cache_.Commit(s, a.allocation_id, {{"a", 0, 64, 100, 0}, {"b", 100, 192, 10, 0}}, &f)
                .code(),
            Status::Code::kInvalidArgument);
  EXPECT_EQ(cache_.Commit(s, a.allocation_id, {{"", 0, 64, 10, 0}}, &f).code(),
            Status::Code::kInvalidArgument);
  ASSERT_TRUE(cache_.Commit(s, a.allocation_id, {{"a", 0, 64, 100, 0}, {"b", 200, 256, 10, 0}}, &f).ok());
  st = cache_.Commit(s, a.allocation_id, {}, &f);
  EXPECT_EQ(st.code(), Status::Code::kFailedPrecondition);
  EXPECT_EQ(st.message(), "allocation " + std::to_string(a.allocation_id) + " was already committed");
  AllocateResult b = Alloc(s, "/c/b.pt", 1000);
  ASSERT_TRUE(cache_.Abort(s, b.allocation_id).ok());
  st = cache_.Commit(s, b.allocation_id, {}, &f);
  EXPECT_EQ(st.code(), Status::Code::kFailedPrecondition);
  EXPECT_NE(st.message().find("was aborted"), std::string::npos);
}

TEST_F(CacheTest, FdOnlyForOwnPendingOrLeasedBuffers) {
  std::string s = cache_.OpenSession(1000, 1), other = cache_.OpenSession(1000, 2);
  AllocateResult a = Alloc(s, "/c/a.pt", 1000);
  int fd;
  bool w;
  uint64_t cap;
  EXPECT_EQ(cache_.FdFor(other, a.buffer_id, &fd, &w, &cap).code(), Status::Code::kPermissionDenied);
  EXPECT_EQ(cache_.FdFor(s, 999, &fd, &w, &cap).code(), Status::Code::kNotFound);
  Commit(s, a.allocation_id);
  // committed: not writable by anyone any more, readable under a lease
  EXPECT_EQ(cache_.FdFor(s, a.buffer_id, &fd, &w, &cap).code(), Status::Code::kPermissionDenied);
  FileInfo f;
  uint64_t lease;
  std::vector<uint64_t> unmap;
  ASSERT_TRUE(cache_.Lookup(other, "job", "/c/a.pt", true, &f, &lease, &unmap).ok());
  ASSERT_TRUE(cache_.FdFor(other, a.buffer_id, &fd, &w, &cap).ok());
  EXPECT_FALSE(w);
  close(fd);
}

TEST_F(CacheTest, ListRemoveAndJobsDoNotCollide) {
  std::string s = cache_.OpenSession(1000, 1);
  AllocateResult a = Alloc(s, "/c/x.pt", 100);
  Commit(s, a.allocation_id);
  AllocateResult b;
  ASSERT_TRUE(cache_.Allocate({s, "other-job", "t2", "/c/x.pt", 3, 100}, &b).ok());
  FileInfo committed;
  ASSERT_TRUE(cache_.Commit(s, b.allocation_id, {}, &committed).ok());
  AllocateResult p = Alloc(s, "/c/pending.pt", 100);
  std::vector<FileInfo> all = cache_.List("", "");
  ASSERT_EQ(all.size(), 3u);
  EXPECT_EQ(cache_.List("other-job", "").size(), 1u);
  EXPECT_EQ(cache_.List("", "t2")[0].rank, 3);
  std::vector<FileInfo> mine = cache_.List("job", "");  // sorted by (job, tag, path)
  ASSERT_EQ(mine.size(), 2u);
  EXPECT_EQ(mine[0].path, "/c/pending.pt");
  EXPECT_EQ(mine[0].state, FileState::kPending);
  EXPECT_EQ(mine[1].state, FileState::kCached);
  FileInfo removed;
  ASSERT_TRUE(cache_.Remove(s, "job", "/c/x.pt", &removed).ok());
  EXPECT_EQ(removed.path, "/c/x.pt");
  EXPECT_EQ(cache_.Remove(s, "job", "/c/x.pt", &removed).code(), Status::Code::kNotFound);
  EXPECT_EQ(cache_.List("", "").size(), 2u);
  (void)p;
}

TagInfo Tag(const std::string& name, std::vector<TagFile> files, int32_t world = 2) {
  TagInfo t;
  t.job = "job";
  t.tag = name;
  t.world_size = world;
  t.files = std::move(files);
  return t;
}

TEST_F(CacheTest, CommitTagValidatesAndSorts) {
  std::string s = cache_.OpenSession(getuid(), getpid());
  TagInfo out;
  struct Bad {
    TagInfo tag;
    const char* message;
  } bad[] = {
      {Tag("", {{0, "/c/a", 1}}), "a tag needs a name"},
      {Tag("t", {}), "tag t lists no files"},
      {Tag("t", {{0, "/c/a", 1}}, 0), "world_size must be >= 1, got 0"},
      {Tag("t", {{0, "rel/a", 1}}), "tag file path must be absolute: 'rel/a'"},
      {Tag("t", {{2, "/c/a", 1}}), "rank 2 of /c/a is outside world_size 2"},
      {Tag("t", {{0, "/c/a", 1}, {1, "/c/a", 1}}), "file listed twice in tag t: /c/a"},
  };
  for (Bad& b : bad) {
    Status st = cache_.CommitTag(s, b.tag, &out);
    EXPECT_EQ(st.code(), Status::Code::kInvalidArgument) << b.message;
    EXPECT_EQ(st.message(), b.message);
  }
  TagInfo nojob = Tag("t", {{0, "/c/a", 1}});
  nojob.job.clear();
  EXPECT_EQ(cache_.CommitTag(s, nojob, &out).message(), "a tag needs a job");
  EXPECT_EQ(cache_.CommitTag("nobody", Tag("t", {{0, "/c/a", 1}}), &out).code(),
            Status::Code::kUnauthenticated);
  EXPECT_TRUE(cache_.ListTags("job").empty());  // nothing refused was recorded

  Save(s, "/c/a", 4);
  Save(s, "/c/b", 3);
  ASSERT_TRUE(cache_.CommitTag(s, Tag("step2", {{1, "/c/z", 5}, {0, "/c/b", 3}, {0, "/c/a", 4}}), &out).ok());
  ASSERT_EQ(out.files.size(), 3u);
  EXPECT_EQ(out.files[0].path, "/c/a");
  EXPECT_EQ(out.files[1].path, "/c/b");
  EXPECT_EQ(out.files[2].rank, 1);
  EXPECT_GT(out.complete_unix_ns, 0);
}

TEST_F(CacheTest, ListTagsIsPerJobOldestFirstAndReRecordingReplaces) {
  std::string s = cache_.OpenSession(getuid(), getpid());
  TagInfo out;
  Save(s, "/c/9", 1);
  Save(s, "/c/10", 1);
  Save(s, "/c/o", 1, "other");
  ASSERT_TRUE(cache_.CommitTag(s, Tag("step9", {{0, "/c/9", 1}}), &out).ok());
  ASSERT_TRUE(cache_.CommitTag(s, Tag("step10", {{0, "/c/10", 1}}), &out).ok());
  TagInfo other = Tag("step1", {{0, "/c/o", 1}});
  other.job = "other";
  ASSERT_TRUE(cache_.CommitTag(s, other, &out).ok());
  std::vector<TagInfo> tags = cache_.ListTags("job");
  ASSERT_EQ(tags.size(), 2u);
  EXPECT_EQ(tags[0].tag, "step9");  // by completion time, not by name
  EXPECT_EQ(tags[1].tag, "step10");
  ASSERT_TRUE(cache_.CommitTag(s, Tag("step9", {{0, "/c/9", 1}, {1, "/c/9b", 2}}), &out).ok());
  tags = cache_.ListTags("job");
  ASSERT_EQ(tags.size(), 2u);
  EXPECT_EQ(tags[1].tag, "step9");  // replaced, and now the newest
  EXPECT_EQ(tags[1].files.size(), 2u);
  EXPECT_EQ(cache_.ListTags("other").size(), 1u);
  EXPECT_TRUE(cache_.ListTags("nobody").empty());
}

}  // namespace
}  // namespace tce

namespace tce {
namespace {

// Two users and root on one server: what each may do with the others' jobs.
class CacheAccessTest : public CacheTest {
 protected:
  explicit CacheAccessTest(const SessionLimits& limits = SessionLimits()) : CacheTest(64 * kMiB, true, limits) {}
  // Alice saves a file; root's session looks it up. `admin`: what the
  // cache says of root.
  Status RootLooksUpAlicesFile(bool* admin) {
    Save(alice_, "/c/a.pt", 1000);
    Status s = cache_.CheckCaller(root_, admin);
    if (!s.ok()) return s;
    FileInfo f;
    uint64_t lease = 0;
    std::vector<uint64_t> unmap;
    return cache_.Lookup(root_, "job", "/c/a.pt", false, &f, &lease, &unmap);
  }

  const std::string alice_ = cache_.OpenSession(1001, 11), bob_ = cache_.OpenSession(1002, 12),
                    root_ = cache_.OpenSession(0, 13);
};

TEST_F(CacheAccessTest, AClaimHoldsTenMinutesUnlessItsNodeIsDroppedForTheJob) {
  EXPECT_EQ(cache_.ClaimRead("job", "/c/a.pt", "c:1"), "c:1");
  EXPECT_EQ(cache_.ClaimRead("job", "/c/b.pt", "c:1"), "c:1");
  EXPECT_EQ(cache_.ClaimRead("other", "/c/a.pt", "c:1"), "c:1");
  EXPECT_EQ(cache_.ClaimRead("job", "/c/a.pt", "b:1"), "c:1");  // the first node that asked reads it
  clock_.Advance(std::chrono::minutes(10) - std::chrono::milliseconds(1));
  EXPECT_EQ(cache_.ClaimRead("job", "/c/a.pt", "b:1"), "c:1");
  EXPECT_EQ(cache_.DropClaims("job", "b:1"), 0u);
  EXPECT_EQ(cache_.DropClaims("job", "c:1"), 2u);  // c stopped answering: its claims on the job's files go
  EXPECT_EQ(cache_.ClaimRead("job", "/c/a.pt", "b:1"), "b:1");
  EXPECT_EQ(cache_.ClaimRead("job", "/c/b.pt", "a:1"), "a:1");
  EXPECT_EQ(cache_.ClaimRead("other", "/c/a.pt", "b:1"), "c:1");  // another job's stay
  clock_.Advance(std::chrono::milliseconds(1));
  EXPECT_EQ(cache_.ClaimRead("other", "/c/a.pt", "b:1"), "b:1");  // ten minutes: the claim lapsed
}

TEST_F(CacheAccessTest, AnotherUidCannotReadRemoveOverwriteOrWaitForAJobsFiles) {
  Save(alice_, "/c/a.pt", 1000);
  FileInfo f;
  uint64_t lease = 0;
  std::vector<uint64_t> unmap;
  const std::string owner = ": job 'job' belongs to uid 1001";
  Status s = cache_.Lookup(bob_, "job", "/c/a.pt", true, &f, &lease, &unmap);
  EXPECT_EQ(s.code(), Status::Code::kPermissionDenied);
  EXPECT_EQ(s.message(), "uid 1002 may not read /c/a.pt of job 'job'" + owner);
  s = cache_.Remove(bob_, "job", "/c/a.pt", &f);
  EXPECT_EQ(s.message(), "uid 1002 may not remove /c/a.pt of job 'job'" + owner);
  Alloc(bob_, "/c/a.pt", 1000, &s);
  EXPECT_EQ(s.message(), "uid 1002 may not write /c/a.pt in job 'job'" + owner);
  Alloc(bob_, "/c/new.pt", 1000, &s);  // a new path of the same job, too
  EXPECT_EQ(s.code(), Status::Code::kPermissionDenied);
  std::vector<FileInfo> waited;
  s = cache_.Wait(bob_, "job", {"/c/a.pt"}, std::chrono::milliseconds(1), &waited);
  EXPECT_EQ(s.code(), Status::Code::kPermissionDenied);
  // Nothing of it changed: alice still reads her file.
  ASSERT_TRUE(cache_.Lookup(alice_, "job", "/c/a.pt", false, &f, &lease, &unmap).ok());
  EXPECT_EQ(f.owner_uid, 1001u);
  EXPECT_EQ(f.size, 1000u);
}

TEST_F(CacheAccessTest, TagsAndRingsBelongToTheJobsOwner) {
  Save(alice_, "/c/a.pt", 1000);
  TagInfo out;
  Status s = cache_.CommitTag(bob_, Tag("t", {{0, "/c/a.pt", 1000}}), &out);
  EXPECT_EQ(s.message(), "uid 1002 may not commit tag 't' into job 'job': job 'job' belongs to uid 1001");
  std::vector<TagInfo> tags;
  s = cache_.ListTags(bob_, "job", &tags);
  EXPECT_EQ(s.message(), "uid 1002 may not list the tags of job 'job': job 'job' belongs to uid 1001");
  ASSERT_TRUE(cache_.CommitTag(alice_, Tag("t", {{0, "/c/a.pt", 1000}}), &out).ok());
  ASSERT_TRUE(cache_.ListTags(alice_, "job", &tags).ok());
  EXPECT_EQ(tags.size(), 1u);
  // A tag names files its job holds: a job nobody owns holds none, and a
  // refused tag claims nothing.
  TagInfo first = Tag("t", {{0, "/c/b.pt", 1}});
  first.job = "bobs";
  s = cache_.CommitTag(bob_, first, &out);
  EXPECT_EQ(s.code(), Status::Code::kNotFound);
  EXPECT_EQ(s.message(), "tag 't' names no file job 'bobs' holds on this server: a tag is recorded on a node "
                         "that saved files of it");
  uid_t owner = 0;
  EXPECT_FALSE(cache_.JobUid("bobs", &owner));
  Save(bob_, "/c/b.pt", 1, "bobs");
  ASSERT_TRUE(cache_.CommitTag(bob_, first, &out).ok());
  AllocateResult a;
  s = cache_.Allocate({alice_, "bobs", "t", "/c/b2.pt", 0, 100}, &a);
  EXPECT_EQ(s.message(), "uid 1001 may not write /c/b2.pt in job 'bobs': job 'bobs' belongs to uid 1002");
  std::string successor;
  s = cache_.SetRing(alice_, "bobs", 0, {"h:1"}, &successor);
  EXPECT_EQ(s.message(), "uid 1001 may not set the ring of job 'bobs': job 'bobs' belongs to uid 1002");
}

TEST_F(CacheAccessTest, ListShowsANonRootCallerOnlyItsOwnJobs) {
  Save(alice_, "/c/a.pt", 1000);
  AllocateResult b;
  ASSERT_TRUE(cache_.Allocate({bob_, "bobs", "t", "/c/b.pt", 0, 100}, &b).ok());  // PENDING counts
  std::vector<FileInfo> seen;
  ASSERT_TRUE(cache_.List(alice_, "", "", &seen).ok());
  ASSERT_EQ(seen.size(), 1u);
  EXPECT_EQ(seen[0].path, "/c/a.pt");
  ASSERT_TRUE(cache_.List(bob_, "job", "", &seen).ok());
  EXPECT_TRUE(seen.empty());
  ASSERT_TRUE(cache_.List(root_, "", "", &seen).ok());
  EXPECT_EQ(seen.size(), 2u);
  EXPECT_EQ(cache_.List("stolen", "", "", &seen).code(), Status::Code::kUnauthenticated);
}

TEST_F(CacheAccessTest, RootIsAnAdministrator) {
  bool admin = false;
  EXPECT_TRUE(RootLooksUpAlicesFile(&admin).ok());
  EXPECT_TRUE(admin);
}

class NoRootAdminTest : public CacheAccessTest {
 protected:
  NoRootAdminTest() : CacheAccessTest(SessionLimits{/*root_is_admin=*/false, 4096}) {}
};

TEST_F(NoRootAdminTest, RootIsNoAdministratorWhenTurnedOff) {
  bool admin = true;
  EXPECT_EQ(RootLooksUpAlicesFile(&admin).code(), Status::Code::kPermissionDenied);
  EXPECT_FALSE(admin);
}

TEST_F(CacheAccessTest, AFreeBufferIsNeverHandedToAnotherUid) {
  AllocateResult a = Alloc(alice_, "/c/a.pt", 1000);
  int fd = Fd(alice_, a.buffer_id);
  close(fd);
  ASSERT_TRUE(cache_.Abort(alice_, a.allocation_id).ok());  // the buffer is free again
  AllocateResult b;
  ASSERT_TRUE(cache_.Allocate({bob_, "bobs", "t", "/c/b.pt", 0, 1000}, &b).ok());
  EXPECT_NE(b.buffer_id, a.buffer_id);  // a new (zero-filled) buffer
  ASSERT_TRUE(cache_.Abort(bob_, b.allocation_id).ok());
  AllocateResult again = Alloc(alice_, "/c/a.pt", 1000);
  EXPECT_EQ(again.buffer_id, a.buffer_id);  // reused for its own uid
}

class TwoLeasesTest : public CacheAccessTest {
 protected:
  TwoLeasesTest() : CacheAccessTest(SessionLimits{/*root_is_admin=*/true, /*max_leases_per_session=*/2}) {}
};

TEST_F(TwoLeasesTest, LeasesPerSessionAreCapped) {
  Save(alice_, "/c/a.pt", 1000);
  FileInfo f;
  uint64_t l1 = 0, l2 = 0, l3 = 0;
  std::vector<uint64_t> unmap;
  ASSERT_TRUE(cache_.Lookup(alice_, "job", "/c/a.pt", true, &f, &l1, &unmap).ok());
  ASSERT_TRUE(cache_.Lookup(alice_, "job", "/c/a.pt", true, &f, &l2, &unmap).ok());
  Status s = cache_.Lookup(alice_, "job", "/c/a.pt", true, &f, &l3, &unmap);
  EXPECT_EQ(s.code(), Status::Code::kResourceExhausted);
  EXPECT_EQ(s.message(), "this session holds 2 leases (max_leases_per_session=2): release loaded "
                         "files before loading more");
  EXPECT_TRUE(cache_.Lookup(alice_, "job", "/c/a.pt", false, &f, &l3, &unmap).ok());  // no lease: fine
  ASSERT_TRUE(cache_.Release(alice_, {l1}, {}).ok());
  EXPECT_TRUE(cache_.Lookup(alice_, "job", "/c/a.pt", true, &f, &l3, &unmap).ok());
}

TEST_F(CacheAccessTest, IdleMeansNoRequestNoLeaseAndNoPendingAllocation) {
  Save(alice_, "/c/a.pt", 1000);
  FileInfo f;
  uint64_t lease = 0;
  std::vector<uint64_t> unmap;
  ASSERT_TRUE(cache_.Lookup(alice_, "job", "/c/a.pt", true, &f, &lease, &unmap).ok());
  AllocateResult pending;
  ASSERT_TRUE(cache_.Allocate({bob_, "bobs", "t", "/c/b.pt", 0, 100}, &pending).ok());
  clock_.Advance(std::chrono::milliseconds(9));
  EXPECT_TRUE(cache_.IdleSessions(std::chrono::milliseconds(10)).empty());  // used 9 ms ago
  clock_.Advance(std::chrono::milliseconds(1));
  std::vector<std::string> idle = cache_.IdleSessions(std::chrono::milliseconds(10));
  EXPECT_EQ(idle, std::vector<std::string>{root_});  // alice leases, bob writes
  EXPECT_TRUE(cache_.IdleSessions(std::chrono::seconds(60)).empty());
  ASSERT_TRUE(cache_.Release(alice_, {lease}, {}).ok());
  ASSERT_TRUE(cache_.Abort(bob_, pending.allocation_id).ok());
  EXPECT_EQ(cache_.IdleSessions(std::chrono::milliseconds(10)), std::vector<std::string>{root_});  // just used
  clock_.Advance(std::chrono::milliseconds(10));
  EXPECT_EQ(cache_.IdleSessions(std::chrono::milliseconds(10)).size(), 3u);
}

}  // namespace
}  // namespace tce
