#include "cache/cache.h"

#include <gtest/gtest.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>

#include "cache/cache_fixture.h"

namespace tce {
namespace {
using namespace cache_testing;

TEST_F(CacheTest, RoundTripThroughTheServersMemory) {
  std::string s = cache_.sessions()->OpenSession(getuid(), getpid());
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
  std::string s = cache_.sessions()->OpenSession(getuid(), getpid());
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
  std::string a = cache_.sessions()->OpenSession(1000, 1), b = cache_.sessions()->OpenSession(1000, 2);
  Save(a, "/c/x.pt", kMiB);
  Save(a, "/c/x.pt", kMiB);  // first buffer is now free but mapped by a
  AllocateResult other = Alloc(b, "/c/y.pt", kMiB);
  EXPECT_EQ(cache_.Stats().buffers_created, 3u);
  EXPECT_EQ(cache_.Stats().buffers_reused, 0u);
  (void)other;
}

TEST_F(SmallCacheTest, FullCacheSaysWhy) {
  std::string s = cache_.sessions()->OpenSession(1000, 1);
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
  std::string s = cache_.sessions()->OpenSession(1000, 1);
  AllocateResult a = Alloc(s, "/c/a.pt", 6 * kMiB);  // never mapped
  ASSERT_TRUE(cache_.Abort(s, a.allocation_id).ok());
  AllocateResult b = Alloc(s, "/c/b.pt", 3 * kMiB);  // does not fit a's buffer...
  EXPECT_NE(b.buffer_id, a.buffer_id);
  AllocateResult c = Alloc(s, "/c/c.pt", 4 * kMiB);  // ...and a is destroyed for c
  EXPECT_TRUE(c.unmap_buffer_ids.empty());
  EXPECT_EQ(cache_.Stats().buffers, 2u);
}

TEST_F(SmallCacheTest, ReclaimsOurOwnMappedBufferAndSaysUnmap) {
  std::string s = cache_.sessions()->OpenSession(1000, 1);
  AllocateResult a = Alloc(s, "/c/a.pt", 6 * kMiB);
  close(Fd(s, a.buffer_id));
  ASSERT_TRUE(cache_.Abort(s, a.allocation_id).ok());
  AllocateResult b = Alloc(s, "/c/b.pt", 8 * kMiB);
  EXPECT_EQ(b.unmap_buffer_ids, std::vector<uint64_t>{a.buffer_id});
  EXPECT_EQ(cache_.Stats().buffers, 1u);
}

TEST_F(SmallCacheTest, OtherSessionsBufferIsFreedAtOnceAndUnmappedLater) {
  std::string a = cache_.sessions()->OpenSession(1000, 1), b = cache_.sessions()->OpenSession(1000, 2);
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
  std::string a = cache_.sessions()->OpenSession(1000, 1), b = cache_.sessions()->OpenSession(1000, 2);
  AllocateResult x = Alloc(a, "/c/a.pt", 6 * kMiB);
  close(Fd(a, x.buffer_id));
  ASSERT_TRUE(cache_.Abort(a, x.allocation_id).ok());
  Alloc(b, "/c/b.pt", 8 * kMiB);  // retires a's buffer
  EXPECT_EQ(cache_.Stats().buffers, 2u);  // b's, and the retired one a still maps
  EXPECT_EQ(cache_.Stats().used, Buffer::CapacityFor(8 * kMiB));  // the retired one holds nothing
  cache_.sessions()->CloseSession(a);
  EXPECT_EQ(cache_.Stats().buffers, 1u);
}

TEST_F(CacheTest, LeaseKeepsReplacedBufferUntilReleased) {
  std::string s = cache_.sessions()->OpenSession(1000, 1);
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
  std::string dead = cache_.sessions()->OpenSession(1000, 1), live = cache_.sessions()->OpenSession(1000, 2);
  AllocateResult a = Alloc(dead, "/c/x.pt", 3 * kMiB);
  EXPECT_GT(cache_.Stats().pending, 0u);
  cache_.sessions()->CloseSession(dead);
  CacheStats st = cache_.Stats();
  EXPECT_EQ(st.pending, 0u);
  EXPECT_EQ(st.sessions, 1u);
  EXPECT_TRUE(Files(cache_, "", "").empty());
  AllocateResult b = Alloc(live, "/c/y.pt", 3 * kMiB);
  EXPECT_EQ(b.buffer_id, a.buffer_id);  // reclaimed and reused
  FileInfo f;
  EXPECT_EQ(cache_.Commit(dead, a.allocation_id, {}, &f).code(), Status::Code::kUnauthenticated);
}

TEST_F(CacheTest, ValidationErrors) {
  std::string s = cache_.sessions()->OpenSession(1000, 1);
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
  std::string s = cache_.sessions()->OpenSession(1000, 1), other = cache_.sessions()->OpenSession(1000, 2);
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
  std::string s = cache_.sessions()->OpenSession(1000, 1), other = cache_.sessions()->OpenSession(1000, 2);
  AllocateResult a = Alloc(s, "/c/a.pt", 1000);
  int fd;
  bool w;
  uint64_t cap;
  EXPECT_EQ(cache_.sessions()->FdFor(other, a.buffer_id, &fd, &w, &cap).code(), Status::Code::kPermissionDenied);
  EXPECT_EQ(cache_.sessions()->FdFor(s, 999, &fd, &w, &cap).code(), Status::Code::kNotFound);
  Commit(s, a.allocation_id);
  // committed: not writable by anyone any more, readable under a lease
  EXPECT_EQ(cache_.sessions()->FdFor(s, a.buffer_id, &fd, &w, &cap).code(), Status::Code::kPermissionDenied);
  FileInfo f;
  uint64_t lease;
  std::vector<uint64_t> unmap;
  ASSERT_TRUE(cache_.Lookup(other, "job", "/c/a.pt", true, &f, &lease, &unmap).ok());
  ASSERT_TRUE(cache_.sessions()->FdFor(other, a.buffer_id, &fd, &w, &cap).ok());
  EXPECT_FALSE(w);
  close(fd);
}

TEST_F(CacheTest, ListRemoveAndJobsDoNotCollide) {
  std::string s = cache_.sessions()->OpenSession(1000, 1);
  AllocateResult a = Alloc(s, "/c/x.pt", 100);
  Commit(s, a.allocation_id);
  AllocateResult b;
  ASSERT_TRUE(cache_.Allocate({s, "other-job", "t2", "/c/x.pt", 3, 100}, &b).ok());
  FileInfo committed;
  ASSERT_TRUE(cache_.Commit(s, b.allocation_id, {}, &committed).ok());
  AllocateResult p = Alloc(s, "/c/pending.pt", 100);
  std::vector<FileInfo> all = Files(cache_, "", "");
  ASSERT_EQ(all.size(), 3u);
  EXPECT_EQ(Files(cache_, "other-job", "").size(), 1u);
  EXPECT_EQ(Files(cache_, "", "t2")[0].rank, 3);
  std::vector<FileInfo> mine = Files(cache_, "job", "");  // sorted by (job, tag, path)
  ASSERT_EQ(mine.size(), 2u);
  EXPECT_EQ(mine[0].path, "/c/pending.pt");
  EXPECT_EQ(mine[0].state, FileState::kPending);
  EXPECT_EQ(mine[1].state, FileState::kCached);
  FileInfo removed;
  ASSERT_TRUE(cache_.Remove(s, "job", "/c/x.pt", &removed).ok());
  EXPECT_EQ(removed.path, "/c/x.pt");
  EXPECT_EQ(cache_.Remove(s, "job", "/c/x.pt", &removed).code(), Status::Code::kNotFound);
  EXPECT_EQ(Files(cache_, "", "").size(), 2u);
  (void)p;
}

TEST_F(CacheTest, CommitTagValidatesAndSorts) {
  std::string s = cache_.sessions()->OpenSession(getuid(), getpid());
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
  EXPECT_TRUE(Tags(cache_, "job").empty());  // nothing refused was recorded

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
  std::string s = cache_.sessions()->OpenSession(getuid(), getpid());
  TagInfo out;
  Save(s, "/c/9", 1);
  Save(s, "/c/10", 1);
  Save(s, "/c/o", 1, "other");
  ASSERT_TRUE(cache_.CommitTag(s, Tag("step9", {{0, "/c/9", 1}}), &out).ok());
  ASSERT_TRUE(cache_.CommitTag(s, Tag("step10", {{0, "/c/10", 1}}), &out).ok());
  TagInfo other = Tag("step1", {{0, "/c/o", 1}});
  other.job = "other";
  ASSERT_TRUE(cache_.CommitTag(s, other, &out).ok());
  std::vector<TagInfo> tags = Tags(cache_, "job");
  ASSERT_EQ(tags.size(), 2u);
  EXPECT_EQ(tags[0].tag, "step9");  // by completion time, not by name
  EXPECT_EQ(tags[1].tag, "step10");
  ASSERT_TRUE(cache_.CommitTag(s, Tag("step9", {{0, "/c/9", 1}, {1, "/c/9b", 2}}), &out).ok());
  tags = Tags(cache_, "job");
  ASSERT_EQ(tags.size(), 2u);
  EXPECT_EQ(tags[1].tag, "step9");  // replaced, and now the newest
  EXPECT_EQ(tags[1].files.size(), 2u);
  EXPECT_EQ(Tags(cache_, "other").size(), 1u);
  EXPECT_TRUE(Tags(cache_, "nobody").empty());
}

}  // namespace
}  // namespace tce
