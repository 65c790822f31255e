#include "cache/buffer.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstring>

namespace tce {

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
