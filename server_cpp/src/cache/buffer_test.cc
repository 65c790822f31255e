#include "cache/buffer.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstring>

namespace tce {

TEST(Buffer, CapacityHeadroomAndFit) {
  constexpr uint64_t kMiB = 1 << 20;
  EXPECT_EQ(Buffer::CapacityFor(100), 4096u);
  uint64_t c = Buffer::CapacityFor(100 * kMiB);
  EXPECT_GT(c, 100 * kMiB);
  EXPECT_TRUE(Buffer::Fits(c, 100 * kMiB + 17));  // a slightly longer pickle still fits
  EXPECT_FALSE(Buffer::Fits(c, 50 * kMiB));        // far too big a buffer is not used
  EXPECT_FALSE(Buffer::Fits(4096, 5000));
}

TEST(Buffer, PrefaultedSealedAndShared) {
  std::unique_ptr<Buffer> b;
  ASSERT_TRUE(Buffer::Create(7, 1 << 20, &b).ok());
  EXPECT_EQ(b->capacity(), 1u << 20);
  int seals = fcntl(b->fd(), F_GET_SEALS);
  EXPECT_TRUE(seals & F_SEAL_SHRINK);
  EXPECT_TRUE(seals & F_SEAL_GROW);
  EXPECT_TRUE(seals & F_SEAL_SEAL);
  EXPECT_NE(ftruncate(b->fd(), 4096), 0);  // cannot shrink under the server
  struct stat st;
  ASSERT_EQ(fstat(b->fd(), &st), 0);
  EXPECT_EQ(st.st_blocks * 512, 1 << 20);  // pages exist already (fallocate)

  int w = -1, r = -1;
  ASSERT_TRUE(b->NewFd(true, &w).ok());
  ASSERT_TRUE(b->NewFd(false, &r).ok());
  void* wm = mmap(nullptr, 1 << 20, PROT_READ | PROT_WRITE, MAP_SHARED, w, 0);
  ASSERT_NE(wm, MAP_FAILED);
  std::memcpy(wm, "hello", 5);
  // The read-only fd cannot be mapped shared-writable, but reads the bytes.
  EXPECT_EQ(mmap(nullptr, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, r, 0), MAP_FAILED);
  void* rm = mmap(nullptr, 4096, PROT_READ, MAP_SHARED, r, 0);
  ASSERT_NE(rm, MAP_FAILED);
  EXPECT_EQ(std::memcmp(rm, "hello", 5), 0);
  munmap(wm, 1 << 20);
  munmap(rm, 4096);
  close(w);
  close(r);
}

}  // namespace tce
