// RangeBuffers: one buffer per session, reached only by that session,
// bounded in count (in all and per uid) and by the cache's budget, bytes
// placed where the session reads them.
#include "rpc/range_buffers.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstring>

#include "cache/cache.h"

namespace tce {
namespace {

constexpr uint64_t kSize = RangeBuffers::kSize;

TEST(RangeBuffers, EachSessionGetsItsOwnBufferAndReadsWhatWasPlacedThere) {
  Cache cache(2 * kSize);
  RangeBuffers rb(cache.memory_budget(), RangeBuffers::kMax);
  const uid_t me = getuid();
  int fd = -1;
  uint64_t capacity = 0;
  std::shared_ptr<RangeBuffers::Held> hold;
  unsigned char* at = nullptr;
  // No buffer before the session asks the fd socket for one.
  EXPECT_EQ(rb.Place("a", 0, 10, &hold, &at).code(), Status::Code::kFailedPrecondition);
  ASSERT_TRUE(rb.Fd("a", me, &fd, &capacity).ok());
  EXPECT_EQ(capacity, RangeBuffers::kSize);
  struct stat st {};
  ASSERT_EQ(fstat(fd, &st), 0);
  EXPECT_EQ(static_cast<uint64_t>(st.st_size), RangeBuffers::kSize);
  EXPECT_EQ(write(fd, "x", 1), -1);  // read-only for the client
  ASSERT_TRUE(rb.Place("a", RangeBuffers::kSize - 5, 5, &hold, &at).ok());
  memcpy(at, "hello", 5);
  char got[5] = {};
  ASSERT_EQ(pread(fd, got, 5, static_cast<off_t>(RangeBuffers::kSize - 5)), 5);
  EXPECT_EQ(std::string(got, 5), "hello");
  // Past the end, or wrapping: refused before anything is written.
  EXPECT_EQ(rb.Place("a", RangeBuffers::kSize - 4, 5, &hold, &at).code(), Status::Code::kOutOfRange);
  EXPECT_EQ(rb.Place("a", ~0ull - 1, 5, &hold, &at).code(), Status::Code::kOutOfRange);
  // Another session has its own buffer, not this one.
  int other = -1;
  ASSERT_TRUE(rb.Fd("b", me, &other, &capacity).ok());
  ASSERT_EQ(pread(other, got, 5, static_cast<off_t>(RangeBuffers::kSize - 5)), 5);
  EXPECT_EQ(std::string(got, 5), std::string(5, '\0'));
  // Asking again gives the same buffer.
  int again = -1;
  ASSERT_TRUE(rb.Fd("a", me, &again, &capacity).ok());
  ASSERT_EQ(pread(again, got, 5, static_cast<off_t>(RangeBuffers::kSize - 5)), 5);
  EXPECT_EQ(std::string(got, 5), "hello");
  EXPECT_EQ(rb.size(), 2u);
  // The session ends: its buffer goes (a ReadRange still writing keeps it until done).
  rb.Drop("a");
  EXPECT_EQ(rb.size(), 1u);
  EXPECT_EQ(rb.Place("a", 0, 1, &hold, &at).code(), Status::Code::kFailedPrecondition);
  for (int f : {fd, other, again}) close(f);
}

TEST(RangeBuffers, AtMostkMaxExistAtOnce) {
  Cache cache((RangeBuffers::kMax + 1) * kSize);
  RangeBuffers rb(cache.memory_budget(), RangeBuffers::kMax);
  uint64_t capacity = 0;
  for (size_t i = 0; i < RangeBuffers::kMax; ++i) {
    int fd = -1;
    ASSERT_TRUE(rb.Fd("s" + std::to_string(i), 1000 + i, &fd, &capacity).ok());
    close(fd);
  }
  int fd = -1;
  Status s = rb.Fd("late", 2000, &fd, &capacity);
  EXPECT_EQ(s.code(), Status::Code::kResourceExhausted) << s.ToString();
  EXPECT_EQ(s.message(), "8 clients hold a range buffer already");
  EXPECT_EQ(rb.size(), RangeBuffers::kMax);
  rb.Drop("s0");  // one ends: the late one gets its buffer
  ASSERT_TRUE(rb.Fd("late", 2000, &fd, &capacity).ok());
  close(fd);
}

TEST(RangeBuffers, AUidAtItsCapIsRefusedWhileAnotherUidGetsOne) {
  Cache cache(RangeBuffers::kMax * kSize);
  RangeBuffers rb(cache.memory_budget(), 2);
  uint64_t capacity = 0;
  int fd = -1;
  for (const char* session : {"a1", "a2"}) {
    ASSERT_TRUE(rb.Fd(session, 1001, &fd, &capacity).ok());
    close(fd);
  }
  Status s = rb.Fd("a3", 1001, &fd, &capacity);
  EXPECT_EQ(s.code(), Status::Code::kResourceExhausted);
  EXPECT_EQ(s.message(), "uid 1001 holds 2 range buffers (max_range_buffers_per_uid)");
  // A session that has one keeps getting it: the cap is on making them.
  ASSERT_TRUE(rb.Fd("a1", 1001, &fd, &capacity).ok());
  close(fd);
  ASSERT_TRUE(rb.Fd("b1", 1002, &fd, &capacity).ok());
  close(fd);
  EXPECT_EQ(rb.size(), 3u);
  rb.Drop("a2");  // one of the uid's sessions ends: another of its sessions gets one
  ASSERT_TRUE(rb.Fd("a3", 1001, &fd, &capacity).ok());
  close(fd);
}

TEST(RangeBuffers, BuffersBorrowTheirBytesFromTheCachesBudgetUntilFreed) {
  Cache cache(kSize + kSize / 2);
  RangeBuffers rb(cache.memory_budget(), RangeBuffers::kMax);
  const uid_t me = getuid();
  uint64_t capacity = 0;
  int kept = -1;
  ASSERT_TRUE(rb.Fd("a", me, &kept, &capacity).ok());
  EXPECT_EQ(cache.Stats().used, kSize);
  // No room for a second: refused, nothing counted.
  int fd = -1;
  Status s = rb.Fd("b", me, &fd, &capacity);
  EXPECT_EQ(s.code(), Status::Code::kResourceExhausted);
  EXPECT_EQ(s.message(), "no room in the memory budget (memory_budget) for a range buffer of 64.0 MiB");
  EXPECT_EQ(cache.Stats().used, kSize);
  EXPECT_EQ(rb.size(), 1u);
  // A save sees the borrowed bytes: what fits beside them fits, more does not.
  const std::string session = cache.sessions()->OpenSession(me, getpid());
  AllocateResult a;
  s = cache.Allocate(AllocateRequest{session, "job", "tag", "/ckpt/big.pt", 0, kSize * 3 / 4}, &a);
  EXPECT_EQ(s.code(), Status::Code::kResourceExhausted) << s.ToString();
  EXPECT_NE(s.message().find(", 64.0 MiB in range buffers"), std::string::npos) << s.message();
  // A ReadRange writing into the buffer keeps its bytes borrowed past Drop;
  // they come back when it lets go, and the pages are gone though the
  // client still holds the fd.
  std::shared_ptr<RangeBuffers::Held> hold;
  unsigned char* at = nullptr;
  ASSERT_TRUE(rb.Place("a", 0, 4096, &hold, &at).ok());
  memset(at, 'x', 4096);
  struct stat st {};
  ASSERT_EQ(fstat(kept, &st), 0);
  EXPECT_GT(st.st_blocks, 0);
  rb.Drop("a");
  EXPECT_EQ(rb.size(), 0u);
  EXPECT_EQ(cache.Stats().used, kSize);
  hold.reset();
  EXPECT_EQ(cache.Stats().used, 0u);
  ASSERT_EQ(fstat(kept, &st), 0);
  EXPECT_EQ(st.st_blocks, 0);
  close(kept);
  s = cache.Allocate(AllocateRequest{session, "job", "tag", "/ckpt/big.pt", 0, kSize * 3 / 4}, &a);
  ASSERT_TRUE(s.ok()) << s.ToString();
  ASSERT_TRUE(cache.Abort(session, a.allocation_id).ok());
  // A free buffer nobody maps gives way to a range buffer; one a session
  // maps does not (that session would have to map its buffer again).
  ASSERT_TRUE(rb.Fd("b", me, &fd, &capacity).ok());
  close(fd);
  EXPECT_EQ(cache.Stats().buffers, 0u);
  rb.Drop("b");
  s = cache.Allocate(AllocateRequest{session, "job", "tag", "/ckpt/big.pt", 0, kSize * 3 / 4}, &a);
  ASSERT_TRUE(s.ok()) << s.ToString();
  bool writable = false;
  ASSERT_TRUE(cache.sessions()->FdFor(session, a.buffer_id, &fd, &writable, &capacity).ok());
  close(fd);
  ASSERT_TRUE(cache.Abort(session, a.allocation_id).ok());
  EXPECT_EQ(rb.Fd("c", me, &fd, &capacity).code(), Status::Code::kResourceExhausted);
  EXPECT_EQ(cache.Stats().buffers, 1u);
  cache.sessions()->CloseSession(session);
}

}  // namespace
}  // namespace tce
