// The persister tests' fixture: a Cache with one storage root in a temp
// directory, a Persister over a FaultInjectionEnv, and helpers that save a
// small torch-zip-shaped file. Test code only.
#pragma once

#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "cache/cache.h"
#include "cache/cache_fixture.h"
#include "common/manual_clock.h"
#include "common/testing.h"
#include "env/fault_env.h"
#include "persist/persister.h"

namespace tce {
namespace fs = std::filesystem;
using namespace std::chrono_literals;

inline uint32_t Get32(const std::string& s, size_t at) {
  uint32_t v = 0;
  for (int i = 3; i >= 0; --i) v = (v << 8) | static_cast<unsigned char>(s[at + i]);
  return v;
}

// A file shaped like one torch-zip record: header, payload, data descriptor,
// central directory entry. Only what the persister checks is real.
struct FakeZip {
  static constexpr uint64_t kData = 64, kPayload = 1000;
  static constexpr uint64_t kDesc = kData + kPayload, kCentral = kDesc + 16, kSize = kCentral + 64;
  static std::vector<Record> Records() { return {{"x/data/0", 0, kData, kPayload, 0, kCentral}}; }
  static void Fill(unsigned char* p, char fill) {
    std::memset(p, 0, kSize);
    std::memset(p + kData, fill, kPayload);
    std::memcpy(p + kDesc, "PK\x07\x08", 4);
    std::memcpy(p + kCentral, "PK\x01\x02", 4);
  }
};

class PersisterTest : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = MakeTempDir("tce-persist");
  }
  void TearDown() override {
    persister_.reset();
    fs::remove_all(root_);
  }
  // `run` false: the persister starts only when the test calls persister_->Start().
  // `failed_retry`: PersistOptions::failed_retry.
  // With manual_clock_ set first, the cache and the persister run on clock_
  // (moved by the test; a timed wait on it never ends by itself); the cache
  // waits check_timeout_ for storage to answer a stat.
  void Start(int retries = 3, bool direct_io = true, bool run = true,
             std::chrono::milliseconds failed_retry = std::chrono::seconds(30)) {
    Clock* clock = manual_clock_ ? static_cast<Clock*>(&clock_) : Clock::Real();
    PosixStoreOptions file;
    file.direct_io = direct_io;
    CacheOptions co = DiskCache();
    co.storage = DiskRoots(file);
    co.clock = clock;
    co.storage_check_timeout = check_timeout_;
    PersistOptions o;
    o.clock = clock;
    o.threads = 2;
    o.retries = retries;
    o.backoff = 5ms;
    o.failed_retry = failed_retry;
    Build(co, o, run);
  }
  // A cache of `co` and a persister of `o` (writing through co.storage)
  // over one queue, as the daemon builds them; the persister starts when
  // `run`; session_ is a session of this process.
  void Build(CacheOptions co, PersistOptions o, bool run = true) {
    persister_.reset();
    cache_.reset();
    o.storage = co.storage;
    queue_ = Persister::MakeQueue(o);
    co.persist_feed = queue_.get();
    cache_.reset(new Cache(co));
    persister_.reset(new Persister(cache_->persistence(), queue_.get(), &env_, o));
    if (run) persister_->Start();
    session_ = cache_->sessions()->OpenSession(getuid(), getpid());
  }
  // root_ as the one storage root, through env_; `file`: how it writes.
  std::shared_ptr<const StorageRoots> DiskRoots(PosixStoreOptions file = PosixStoreOptions()) {
    file.env = &env_;
    return std::make_shared<const StorageRoots>(std::vector<std::string>{root_}, nullptr, file);
  }
  // A cache of `budget` bytes persisting under root_, through env_ (a
  // persister made for it writes through co.storage).
  CacheOptions DiskCache(uint64_t budget = 64 << 20) {
    CacheOptions co(budget);
    co.storage = DiskRoots();
    co.env = &env_;
    return co;
  }
  // Saves a FakeZip whose payload is `fill` bytes at `path` (its directory
  // made first, as torch.save needs it).
  void Save(const std::string& path, char fill, const std::string& tag = "t") {
    Finish(Begin(path, tag), fill);
  }
  // Save's first half: the allocation, `mode` the saver's bits for a new file.
  AllocateResult Begin(const std::string& path, const std::string& tag = "t", uint32_t mode = 0644) {
    std::error_code ignored;
    fs::create_directories(fs::path(path).parent_path(), ignored);
    AllocateRequest req{session_, "job", tag, path, 0, FakeZip::kSize};
    req.mode = mode;
    AllocateResult a;
    Status s = cache_->Allocate(req, &a);
    EXPECT_TRUE(s.ok()) << s.ToString();
    return a;
  }
  // Save's second half: fills the buffer and commits.
  void Finish(const AllocateResult& a, char fill, bool zip_crc32 = true) {
    int fd;
    bool w;
    uint64_t cap;
    ASSERT_TRUE(cache_->sessions()->FdFor(session_, a.buffer_id, &fd, &w, &cap).ok());
    auto* p = static_cast<unsigned char*>(mmap(nullptr, cap, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0));
    FakeZip::Fill(p, fill);
    munmap(p, cap);
    close(fd);
    FileInfo f;
    ASSERT_TRUE(cache_->Commit(session_, a.allocation_id, FakeZip::Records(), &f, zip_crc32).ok());
  }
  // Saves `bytes` as they are (a whole file with its record table) to `path`.
  void CommitBytes(const std::string& path, const std::vector<unsigned char>& bytes,
                   const std::vector<Record>& records) {
    std::error_code ignored;
    fs::create_directories(fs::path(path).parent_path(), ignored);
    AllocateResult a;
    ASSERT_TRUE(cache_->Allocate({session_, "job", "t", path, 0, bytes.size()}, &a).ok());
    int fd;
    bool w;
    uint64_t cap;
    ASSERT_TRUE(cache_->sessions()->FdFor(session_, a.buffer_id, &fd, &w, &cap).ok());
    ASSERT_EQ(pwrite(fd, bytes.data(), bytes.size(), 0), static_cast<ssize_t>(bytes.size()));
    close(fd);
    FileInfo f;
    ASSERT_TRUE(cache_->Commit(session_, a.allocation_id, records, &f).ok());
  }
  Status Wait(const std::string& path, std::vector<FileInfo>* out) {
    return cache_->Wait(session_, "job", {path}, 10s, out);
  }
  std::string Read(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    std::stringstream ss;
    ss << in.rdbuf();
    return ss.str();
  }

  std::string root_;
  bool manual_clock_ = false;
  std::chrono::milliseconds check_timeout_ = std::chrono::seconds(2);
  ManualClock clock_;
  FaultInjectionEnv env_{Env::Default()};
  std::unique_ptr<PersistQueue> queue_;  // the cache feeds it, the persister takes from it
  std::unique_ptr<Cache> cache_;
  std::unique_ptr<Persister> persister_;
  std::string session_;
};

}  // namespace tce
