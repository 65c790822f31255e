// RangeBuffers: one buffer per session, reached only by that session,
// bounded in count, bytes placed where the session reads them.
#include "rpc/range_buffers.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstring>

namespace tce {
namespace {

TEST(RangeBuffers, EachSessionGetsItsOwnBufferAndReadsWhatWasPlacedThere) {
  RangeBuffers rb;
  int fd = -1;
  uint64_t capacity = 0;
  std::shared_ptr<RangeBuffers::Held> hold;
  unsigned char* at = nullptr;
  // No buffer before the session asks the fd socket for one.
  EXPECT_EQ(rb.Place("a", 0, 10, &hold, &at).code(), Status::Code::kFailedPrecondition);
  ASSERT_TRUE(rb.Fd("a", &fd, &capacity).ok());
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
  ASSERT_TRUE(rb.Fd("b", &other, &capacity).ok());
  ASSERT_EQ(pread(other, got, 5, static_cast<off_t>(RangeBuffers::kSize - 5)), 5);
  EXPECT_EQ(std::string(got, 5), std::string(5, '\0'));
  // Asking again gives the same buffer.
  int again = -1;
  ASSERT_TRUE(rb.Fd("a", &again, &capacity).ok());
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
  RangeBuffers rb;
  uint64_t capacity = 0;
  for (size_t i = 0; i < RangeBuffers::kMax; ++i) {
    int fd = -1;
    ASSERT_TRUE(rb.Fd("s" + std::to_string(i), &fd, &capacity).ok());
    close(fd);
  }
  int fd = -1;
  Status s = rb.Fd("late", &fd, &capacity);
  EXPECT_EQ(s.code(), Status::Code::kResourceExhausted) << s.ToString();
  EXPECT_EQ(rb.size(), RangeBuffers::kMax);
  rb.Drop("s0");  // one ends: the late one gets its buffer
  ASSERT_TRUE(rb.Fd("late", &fd, &capacity).ok());
  close(fd);
}

}  // namespace
}  // namespace tce
