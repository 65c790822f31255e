#include "cache/buffer_pool.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <condition_variable>
#include <cstring>
#include <fstream>
#include <mutex>
#include <thread>

#include "cache/buffer.h"
#include "cache/cache.h"

#include "common/testing.h"

namespace tce {
namespace {

constexpr uint64_t kMiB = 1 << 20;

// Counts pooled bytes against a limit, like the Cache; can hold the filler.
class FakeBudget : public PoolBudget {
 public:
  explicit FakeBudget(uint64_t limit) : limit_(limit) {}
  bool ReservePool(uint64_t bytes) override {
    std::unique_lock<std::mutex> lock(mu_);
    ++asked_;
    cv_.notify_all();
    cv_.wait(lock, [this] { return !hold_; });
    if (pooled_ + bytes > limit_) return false;
    pooled_ += bytes;
    return true;
  }
  void ReturnPool(uint64_t bytes) override {
    std::lock_guard<std::mutex> lock(mu_);
    pooled_ -= bytes;
  }
  // While Saving(true), as the Cache with an allocation pending.
  std::chrono::milliseconds WaitForNoSaves(std::chrono::milliseconds max) override {
    std::unique_lock<std::mutex> lock(mu_);
    const auto t0 = std::chrono::steady_clock::now();
    ++yields_;
    // A wait that timed out reports exactly `max`, as if the machine were
    // never late: the filler's yield budget then counts yields, not load.
    if (!cv_.wait_until(lock, t0 + max, [this] { return !saving_; })) return max;
    return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - t0);
  }
  void Saving(bool saving) {
    std::lock_guard<std::mutex> lock(mu_);
    saving_ = saving;
    cv_.notify_all();
  }
  int yields() {
    std::lock_guard<std::mutex> lock(mu_);
    return yields_;
  }
  void Hold(bool hold) {
    std::lock_guard<std::mutex> lock(mu_);
    hold_ = hold;
    cv_.notify_all();
  }
  void WaitAsked() {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [this] { return asked_ > 0; });
  }
  uint64_t pooled() {
    std::lock_guard<std::mutex> lock(mu_);
    return pooled_;
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  const uint64_t limit_;
  uint64_t pooled_ = 0;
  int asked_ = 0;
  bool hold_ = false;
  bool saving_ = false;
  int yields_ = 0;
};

bool AllZero(int fd, uint64_t size) {
  void* m = mmap(nullptr, size, PROT_READ, MAP_SHARED, fd, 0);
  if (m == MAP_FAILED) return false;
  const unsigned char* p = static_cast<const unsigned char*>(m);
  bool zero = true;
  for (uint64_t i = 0; i < size && zero; ++i) zero = p[i] == 0;
  munmap(m, size);
  return zero;
}

uint64_t Allocated(int fd) {
  struct stat st;
  return fstat(fd, &st) == 0 ? static_cast<uint64_t>(st.st_blocks) * 512 : 0;
}

TEST(BufferPool, FillsWithinItsBudgetOnly) {
  FakeBudget budget(24 * kMiB);
  BufferPool pool(64 * kMiB, Backing::k4k, &budget);
  pool.Start();
  ASSERT_TRUE(pool.WaitIdle(10000));
  // The filler's first piece (64 MiB) does not fit; the budget keeps it out.
  PoolStats s = pool.Stats();
  EXPECT_LE(s.held, 24 * kMiB);
  EXPECT_EQ(budget.pooled(), s.held);
  pool.Stop();
  EXPECT_EQ(budget.pooled(), 0u);
}

TEST(BufferPool, TakesArePreFaultedZeroedAndExactlySized) {
  FakeBudget budget(64 * kMiB);
  BufferPool pool(32 * kMiB, Backing::k4k, &budget);
  pool.Start();
  ASSERT_TRUE(pool.WaitIdle(10000));
  ASSERT_EQ(pool.Stats().held, 32 * kMiB);
  ASSERT_EQ(pool.Stats().pieces, 2u);  // half the target, twice
  // Shrunk: the smallest piece that holds it, its tail freed.
  int fd = -1;
  ASSERT_TRUE(pool.Take(5 * kMiB, &fd).ok());
  struct stat st;
  ASSERT_EQ(fstat(fd, &st), 0);
  EXPECT_EQ(static_cast<uint64_t>(st.st_size), 5 * kMiB);
  EXPECT_EQ(Allocated(fd), 5 * kMiB);  // every page exists: no fault at first use
  EXPECT_TRUE(AllZero(fd, 5 * kMiB));
  EXPECT_EQ(pool.Stats().taken, 1u);
  ASSERT_TRUE(pool.WaitIdle(10000));
  EXPECT_EQ(budget.pooled(), pool.Stats().held);  // ...and the filler made new ones
  EXPECT_EQ(pool.Stats().held, 32 * kMiB);
  // The pool seals nothing: a Buffer adopts and seals it.
  std::unique_ptr<Buffer> b;
  ASSERT_TRUE(Buffer::Adopt(3, fd, 5 * kMiB, Backing::k4k, &b).ok());
  EXPECT_TRUE(fcntl(b->fd(), F_GET_SEALS) & F_SEAL_GROW);

  // Grown: larger than any piece; the new pages are pre-faulted and zero too.
  ASSERT_TRUE(pool.WaitIdle(10000));
  const uint64_t held = pool.Stats().held;
  ASSERT_GT(held, 0u);
  ASSERT_TRUE(pool.Take(held + 3 * kMiB, &fd).ok());
  EXPECT_EQ(Allocated(fd), held + 3 * kMiB);
  EXPECT_TRUE(AllZero(fd, held + 3 * kMiB));
  close(fd);
}

TEST(BufferPool, PiecesHalveUntilATakeShowsTheSizesWanted) {
  FakeBudget budget(256 * kMiB);
  BufferPool pool(32 * kMiB, Backing::k4k, &budget, 16 * kMiB);
  pool.Start();
  ASSERT_TRUE(pool.WaitIdle(10000));
  PoolStats st = pool.Stats();
  EXPECT_EQ(st.held, 32 * kMiB);
  EXPECT_EQ(st.pieces, 6u);  // half the target, then halving down to 1 MiB: 16 8 4 2 1 1
  // Best fit: a 3 MiB file takes a 4 MiB piece, a 10 MiB one the 16 MiB piece.
  budget.Hold(true);  // the filler adds nothing until both takes are done
  int small = -1, large = -1;
  ASSERT_TRUE(pool.Take(3 * kMiB, &small).ok());
  EXPECT_EQ(pool.Stats().held, 28 * kMiB);
  ASSERT_TRUE(pool.Take(10 * kMiB, &large).ok());
  EXPECT_EQ(pool.Stats().held, 12 * kMiB);
  EXPECT_EQ(pool.Stats().pieces, 4u);
  budget.Hold(false);
  // Then it refills.
  ASSERT_TRUE(pool.WaitIdle(10000));
  EXPECT_EQ(pool.Stats().held, 32 * kMiB);
  EXPECT_EQ(budget.pooled(), 32 * kMiB);
  close(small);
  close(large);
  pool.Stop();
}

TEST(BufferPool, SmallPiecesAreTradedForOnesOfTheSizeTaken) {
  FakeBudget budget(32 * kMiB);  // less than the target: the budget bounds the pool
  BufferPool pool(64 * kMiB, Backing::k4k, &budget, 16 * kMiB);
  pool.Start();
  ASSERT_TRUE(pool.WaitIdle(10000));
  ASSERT_EQ(pool.Stats().pieces, 6u);  // 16 8 4 2 1 1
  int fd = -1;
  ASSERT_TRUE(pool.Take(12 * kMiB, &fd).ok());  // the 16 MiB piece, shrunk
  close(fd);
  // A 12 MiB piece fits the room left; for a second one the budget has no
  // room, and the small pieces (16 MiB) make way for it.
  ASSERT_TRUE(pool.WaitIdle(10000));
  PoolStats st = pool.Stats();
  EXPECT_EQ(st.pieces, 2u);
  EXPECT_EQ(st.held, 24 * kMiB);
  EXPECT_EQ(budget.pooled(), 24 * kMiB);
  pool.Stop();
}

TEST(BufferPool, TakeNeverWaitsForTheFiller) {
  FakeBudget budget(64 * kMiB);
  budget.Hold(true);  // the filler is stuck making its first piece
  BufferPool pool(32 * kMiB, Backing::k4k, &budget);
  pool.Start();
  budget.WaitAsked();
  int fd = -1;
  Status s = pool.Take(kMiB, &fd);  // returns at all: the filler stays stuck until Hold(false)
  EXPECT_EQ(s.code(), Status::Code::kNotFound);
  EXPECT_EQ(pool.Stats().missed, 1u);
  budget.Hold(false);
  pool.Stop();
}

TEST(BufferPool, TheFillerYieldsToSavesInFlight) {
  FakeBudget budget(256 * kMiB);
  BufferPool pool(2 * BufferPool::kStep, Backing::k4k, &budget);
  pool.Start();
  ASSERT_TRUE(pool.WaitIdle(10000));
  ASSERT_EQ(pool.Stats().held, 2 * BufferPool::kStep);
  // A save is in flight when its buffer is taken: the refill waits for it,
  // and makes the piece once it is done.
  budget.Saving(true);
  const int before = budget.yields();
  int fd = -1;
  ASSERT_TRUE(pool.Take(BufferPool::kStep, &fd).ok());
  close(fd);
  // The filler yields to the save again and again (each slice a yield, far
  // fewer than its yield budget allows), making nothing meanwhile.
  ASSERT_TRUE(Eventually([&] { return budget.yields() >= before + 3; }));
  EXPECT_EQ(pool.Stats().held, BufferPool::kStep);
  EXPECT_FALSE(pool.WaitIdle(0));
  budget.Saving(false);
  ASSERT_TRUE(pool.WaitIdle(10000));
  EXPECT_EQ(pool.Stats().held, 2 * BufferPool::kStep);
}

TEST(BufferPool, ShedFreesSmallestFirst) {
  FakeBudget budget(64 * kMiB);
  BufferPool pool(16 * kMiB, Backing::k4k, &budget);
  pool.Start();
  ASSERT_TRUE(pool.WaitIdle(10000));
  ASSERT_EQ(pool.Stats().pieces, 2u);     // 8 + 8 MiB
  EXPECT_EQ(pool.Shed(kMiB), 8 * kMiB);   // a whole piece
  EXPECT_EQ(pool.Stats().held, 8 * kMiB);
  EXPECT_EQ(budget.pooled(), 8 * kMiB);
  EXPECT_EQ(pool.Shed(UINT64_MAX), 8 * kMiB);
  EXPECT_EQ(budget.pooled(), 0u);
  pool.Stop();
}

// ---- the pool behind a Cache ----

class PoolCacheTest : public ::testing::Test {
 protected:
  AllocateResult Alloc(Cache& c, const std::string& session, const std::string& path, uint64_t size) {
    AllocateRequest r{session, "job", "tag", path, 0, size};
    AllocateResult out;
    Status s = c.Allocate(r, &out);
    EXPECT_TRUE(s.ok()) << s.ToString();
    return out;
  }
  int Fd(Cache& c, const std::string& session, uint64_t buffer) {
    int fd = -1;
    bool w = false;
    uint64_t cap = 0;
    Status s = c.sessions()->FdFor(session, buffer, &fd, &w, &cap);
    EXPECT_TRUE(s.ok()) << s.ToString();
    return fd;
  }
};

TEST_F(PoolCacheTest, PooledBytesAndBuffersStayWithinTheBudget) {
  CacheOptions o(64 * kMiB);
  o.backing = Backing::k4k;
  o.prealloc = 64 * kMiB;
  Cache cache(o);
  BufferPool& pool = *cache.pool();
  pool.Start();
  ASSERT_TRUE(pool.WaitIdle(10000));
  EXPECT_EQ(cache.Stats().pool.held, 64 * kMiB);
  std::string s = cache.sessions()->OpenSession(getuid(), getpid());
  AllocateResult a = Alloc(cache, s, "/ckpt/a.pt", 40 * kMiB);
  CacheStats st = cache.Stats();
  EXPECT_EQ(st.pool.taken, 1u);
  EXPECT_GE(a.capacity, 40 * kMiB);
  EXPECT_LE(st.used + st.pool.held, st.budget);
  // While the save is in flight the filler waits; after it, the filler
  // refills only what the budget leaves.
  EXPECT_EQ(cache.Stats().pool.filled, 64 * kMiB);
  FileInfo info;
  ASSERT_TRUE(cache.Commit(s, a.allocation_id, {}, &info).ok());
  ASSERT_TRUE(pool.WaitIdle(10000));
  st = cache.Stats();
  EXPECT_LE(st.used + st.pool.held, st.budget);
  pool.Stop();
}

TEST_F(PoolCacheTest, AnotherUidsBufferFromThePoolHoldsZeros) {
  CacheOptions o(64 * kMiB);
  o.backing = Backing::k4k;
  o.prealloc = 32 * kMiB;
  Cache cache(o);
  BufferPool& pool = *cache.pool();
  pool.Start();
  ASSERT_TRUE(pool.WaitIdle(10000));
  std::string alice = cache.sessions()->OpenSession(1001, 1);
  AllocateResult a = Alloc(cache, alice, "/ckpt/alice.pt", 4 * kMiB);
  int fd = Fd(cache, alice, a.buffer_id);
  void* m = mmap(nullptr, a.capacity, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  ASSERT_NE(m, MAP_FAILED);
  std::memset(m, 0xA5, a.capacity);
  munmap(m, a.capacity);
  close(fd);
  FileInfo f;
  ASSERT_TRUE(cache.Commit(alice, a.allocation_id, {}, &f).ok());
  ASSERT_TRUE(cache.Remove(alice, "job", "/ckpt/alice.pt", &f).ok());
  cache.sessions()->CloseSession(alice);
  // Bob gets a new buffer (from the pool), never Alice's.
  ASSERT_TRUE(pool.WaitIdle(10000));
  std::string bob = cache.sessions()->OpenSession(1002, 2);
  AllocateRequest r{bob, "bobs", "tag", "/ckpt/bob.pt", 0, 4 * kMiB};
  AllocateResult b;
  ASSERT_TRUE(cache.Allocate(r, &b).ok());
  EXPECT_NE(b.buffer_id, a.buffer_id);
  EXPECT_EQ(cache.Stats().pool.taken, 2u);
  fd = Fd(cache, bob, b.buffer_id);
  EXPECT_TRUE(AllZero(fd, b.capacity));
  close(fd);
  pool.Stop();
}

// Makes `n` huge pages free for the test (on top of those other processes
// use) and puts the old count back. The count is machine-wide and ctest runs
// tests in parallel processes, so it is held under an exclusive lock on a
// shared file.
class HugePages {
 public:
  explicit HugePages(long n) {
    lock_fd_ = open("/tmp/tce-test-hugepages.lock", O_RDWR | O_CREAT | O_CLOEXEC, 0600);
    if (lock_fd_ >= 0) flock(lock_fd_, LOCK_EX);
    if (!(std::ifstream(kPath) >> old_)) return;
    std::ofstream(kPath) << old_ - Free() + n;
    ok_ = Free() >= n;
  }
  ~HugePages() {
    if (old_ >= 0) std::ofstream(kPath) << old_;
    if (lock_fd_ >= 0) close(lock_fd_);  // releases the lock
  }
  bool ok() const { return ok_; }

 private:
  static long Free() {
    std::ifstream in("/proc/meminfo");
    std::string line;
    while (std::getline(in, line))
      if (line.rfind("HugePages_Free:", 0) == 0) return std::stol(line.substr(15));
    return -1;
  }
  static constexpr const char* kPath = "/proc/sys/vm/nr_hugepages";
  int lock_fd_ = -1;
  long old_ = -1;
  bool ok_ = false;
};

TEST_F(PoolCacheTest, HugetlbBuffersAreRoundedAndFallBackTo4kWhenPagesRunOut) {
  HugePages pages(8);  // 16 MiB
  if (!pages.ok()) GTEST_SKIP() << "cannot reserve huge pages (needs root): /proc/sys/vm/nr_hugepages";
  std::unique_ptr<Buffer> odd;
  EXPECT_EQ(Buffer::Create(1, kHugePage + 4096, Backing::kHugetlb, &odd).code(),
            Status::Code::kInvalidArgument);
  {
    CacheOptions o(256 * kMiB);
    o.backing = Backing::kHugetlb;
    Cache cache(o);
    std::string s = cache.sessions()->OpenSession(getuid(), getpid());
    AllocateResult a = Alloc(cache, s, "/ckpt/small.pt", 10000);
    EXPECT_EQ(a.capacity, kHugePage);
    CacheStats st = cache.Stats();
    EXPECT_EQ(st.memory_backing, "hugetlb");
    EXPECT_EQ(st.huge_page_buffers, 1u);
    // A client maps it whole and writes it.
    int fd = Fd(cache, s, a.buffer_id);
    void* m = mmap(nullptr, a.capacity, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    ASSERT_NE(m, MAP_FAILED);
    std::memset(m, 7, a.capacity);
    EXPECT_EQ(munmap(m, a.capacity), 0);
    close(fd);
    // 40 MiB: more than the 7 pages left: made with 4 KiB pages, and counted.
    AllocateResult big = Alloc(cache, s, "/ckpt/big.pt", 40 * kMiB);
    EXPECT_EQ(big.capacity % kHugePage, 0u);
    st = cache.Stats();
    EXPECT_EQ(st.hugetlb_fallbacks, 1u);
    EXPECT_EQ(st.huge_page_buffers, 1u);
    EXPECT_EQ(st.buffers, 2u);
  }
}

TEST_F(PoolCacheTest, AHugetlbPoolHandsOutHugePages) {
  HugePages pages(16);  // 32 MiB
  if (!pages.ok()) GTEST_SKIP() << "cannot reserve huge pages (needs root): /proc/sys/vm/nr_hugepages";
  CacheOptions o(256 * kMiB);
  o.backing = Backing::kHugetlb;
  o.prealloc = 16 * kMiB;
  Cache cache(o);
  BufferPool& pool = *cache.pool();
  pool.Start();
  ASSERT_TRUE(pool.WaitIdle(10000));
  EXPECT_EQ(pool.Stats().held, 16 * kMiB);
  std::string s = cache.sessions()->OpenSession(getuid(), getpid());
  AllocateResult a = Alloc(cache, s, "/ckpt/a.pt", 3 * kMiB);
  EXPECT_EQ(a.capacity % kHugePage, 0u);
  CacheStats st = cache.Stats();
  EXPECT_EQ(st.pool.taken, 1u);
  EXPECT_EQ(st.huge_page_buffers, 1u);
  int fd = Fd(cache, s, a.buffer_id);
  struct stat stt;
  ASSERT_EQ(fstat(fd, &stt), 0);
  EXPECT_EQ(stt.st_blksize, static_cast<blksize_t>(kHugePage));  // hugetlbfs
  EXPECT_TRUE(AllZero(fd, a.capacity));
  close(fd);
  pool.Stop();
}

}  // namespace
}  // namespace tce
