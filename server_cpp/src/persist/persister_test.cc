#include "persist/persister.h"
#include "persist/persister_fixture.h"

#include <gtest/gtest.h>

#include "common/testing.h"
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include "env/fault_env.h"
#include "persist/crc.h"

namespace tce {
namespace {

TEST_F(PersisterTest, WritesTheFileWithCrcsFilled) {
  Start();
  std::string path = root_ + "/ckpt/step1/model.pt";
  Save(path, 'a');
  std::vector<FileInfo> out;
  ASSERT_TRUE(Wait(path, &out).ok());
  ASSERT_EQ(out[0].state, FileState::kPersisted);
  std::string bytes = Read(path);
  ASSERT_EQ(bytes.size(), FakeZip::kSize);
  uint32_t crc = crc32(0, reinterpret_cast<const Bytef*>(bytes.data() + FakeZip::kData), FakeZip::kPayload);
  EXPECT_EQ(Get32(bytes, FakeZip::kDesc + 4), crc);
  EXPECT_EQ(Get32(bytes, FakeZip::kCentral + 16), crc);
  EXPECT_EQ(out[0].records[0].crc32, crc);
  std::vector<std::string> names;  // no temp file is left beside it
  for (const auto& e : fs::directory_iterator(root_ + "/ckpt/step1")) names.push_back(e.path().filename());
  EXPECT_EQ(names, std::vector<std::string>{"model.pt"});
  EXPECT_EQ(cache_->Stats().persisted_files, 1u);
}

TEST_F(PersisterTest, BufferedPathWritesTheSameBytes) {
  Start(/*retries=*/1, /*direct_io=*/false);
  std::string path = root_ + "/buffered.pt";
  Save(path, 'e');
  std::vector<FileInfo> out;
  ASSERT_TRUE(Wait(path, &out).ok());
  ASSERT_EQ(out[0].state, FileState::kPersisted);
  std::string bytes = Read(path);
  ASSERT_EQ(bytes.size(), FakeZip::kSize);
  EXPECT_EQ(bytes[FakeZip::kData], 'e');
  EXPECT_EQ(Get32(bytes, FakeZip::kCentral + 16), out[0].records[0].crc32);
}

TEST_F(PersisterTest, RetriesThroughEnospc) {
  Start(/*retries=*/3);
  env_.FailAppends(ENOSPC, 2);
  std::string path = root_ + "/a.pt";
  Save(path, 'b');
  std::vector<FileInfo> out;
  ASSERT_TRUE(Wait(path, &out).ok());
  EXPECT_EQ(out[0].state, FileState::kPersisted);
  EXPECT_EQ(Read(path).size(), FakeZip::kSize);
}

TEST_F(PersisterTest, FailsWithTheReasonAfterRetriesAndKeepsTheFileInMemory) {
  Start(/*retries=*/2);
  env_.FailAppends(EIO, 100);
  std::string path = root_ + "/b.pt";
  Save(path, 'c');
  std::vector<FileInfo> out;
  ASSERT_TRUE(Wait(path, &out).ok());
  EXPECT_EQ(out[0].state, FileState::kFailed);
  EXPECT_NE(out[0].reason.find("Input/output error"), std::string::npos) << out[0].reason;
  EXPECT_FALSE(fs::exists(path));
  EXPECT_TRUE(fs::is_empty(root_));  // no temp files left behind
  EXPECT_EQ(cache_->Stats().failed_files, 1u);
  FileInfo f;
  uint64_t lease;
  std::vector<uint64_t> unmap;
  EXPECT_TRUE(cache_->Lookup(session_, "job", path, false, &f, &lease, &unmap).ok());
}

TEST_F(PersisterTest, CrashBeforeRenameNeverLeavesATornFile) {
  Start(/*retries=*/0);
  std::string path = root_ + "/c.pt";
  { std::ofstream(path) << "old complete file"; }
  env_.FailRenames(1);
  Save(path, 'd');
  std::vector<FileInfo> out;
  ASSERT_TRUE(Wait(path, &out).ok());
  EXPECT_EQ(out[0].state, FileState::kFailed);
  EXPECT_EQ(Read(path), "old complete file");  // the final path was never touched
}

TEST_F(PersisterTest, NewestVersionWins) {
  Start();
  std::string path = root_ + "/d.pt";
  for (char c : {'1', '2', '3', '4', '5'}) Save(path, c);
  std::vector<FileInfo> out;
  ASSERT_TRUE(Wait(path, &out).ok());
  EXPECT_EQ(out[0].state, FileState::kPersisted);
  EXPECT_EQ(Read(path)[FakeZip::kData], '5');
}

TEST_F(PersisterTest, PathsOutsideTheRootsAreRefusedAtAllocate) {
  Start();
  AllocateResult a;
  Status s = cache_->Allocate({session_, "job", "t", "/etc/tce-test.pt", 0, 100}, &a);
  EXPECT_EQ(s.code(), Status::Code::kPermissionDenied);
  EXPECT_NE(s.message().find("is not under a storage root"), std::string::npos) << s.message();
  fs::create_symlink("/etc", root_ + "/escape");
  s = cache_->Allocate({session_, "job", "t", root_ + "/escape/x.pt", 0, 100}, &a);
  EXPECT_EQ(s.code(), Status::Code::kPermissionDenied);
  EXPECT_NE(s.message().find("resolves to /etc/x.pt"), std::string::npos) << s.message();
}

TEST_F(PersisterTest, WaitWithoutPersistenceSaysSo) {
  Cache memory_only(1 << 20);
  std::string s = memory_only.sessions()->OpenSession(1, 1);
  std::vector<FileInfo> out;
  EXPECT_EQ(memory_only.Wait(s, "job", {"/x"}, 1s, &out).code(), Status::Code::kFailedPrecondition);
}
}  // namespace
}  // namespace tce

namespace tce {
namespace {

class EvictionTest : public PersisterTest {
 protected:
  void StartSmall(std::chrono::milliseconds full_timeout) {
    CacheOptions co = DiskCache(3 * Buffer::CapacityFor(FakeZip::kSize));
    co.full_timeout = full_timeout;
    PersistOptions o;
    o.backoff = 5ms;
    o.retries = 0;
    Build(co, o);
  }
  // Allocates a file of FakeZip size; returns the status only.
  Status TryAllocate(const std::string& path) {
    AllocateResult a;
    return cache_->Allocate({session_, "job", "t", path, 0, FakeZip::kSize}, &a);
  }
};

TEST_F(EvictionTest, PersistedFilesMakeRoomOldestFirst) {
  StartSmall(2s);
  for (int i = 0; i < 6; ++i) {  // twice the budget
    std::string path = root_ + "/f" + std::to_string(i) + ".pt";
    Save(path, static_cast<char>('a' + i));
    std::vector<FileInfo> out;
    ASSERT_TRUE(Wait(path, &out).ok());
  }
  std::vector<FileInfo> all = cache_testing::Files(*cache_, "job", "");
  ASSERT_EQ(all.size(), 6u);
  EXPECT_EQ(all[0].state, FileState::kEvicted);  // f0..f2, the oldest
  EXPECT_EQ(all[2].state, FileState::kEvicted);
  EXPECT_EQ(all[3].state, FileState::kPersisted);
  EXPECT_EQ(all[5].state, FileState::kPersisted);
  EXPECT_EQ(cache_->Stats().evicted_files, 3u);
  FileInfo f;
  uint64_t lease;
  std::vector<uint64_t> unmap;
  Status s = cache_->Lookup(session_, "job", root_ + "/f0.pt", false, &f, &lease, &unmap);
  EXPECT_EQ(s.code(), Status::Code::kNotFound);
  EXPECT_NE(s.message().find("evicted"), std::string::npos);
  EXPECT_EQ(Read(root_ + "/f0.pt")[FakeZip::kData], 'a');  // storage has it
}

TEST_F(EvictionTest, UnpersistedFilesAreNeverEvicted) {
  StartSmall(20s);
  env_.FailAppends(EIO, 1000);  // nothing ever reaches storage
  std::vector<std::string> paths;
  for (int i = 0; i < 3; ++i) {
    paths.push_back(root_ + "/u" + std::to_string(i) + ".pt");
    Save(paths.back(), 'u');
  }
  std::vector<FileInfo> out;
  ASSERT_TRUE(cache_->Wait(session_, "job", paths, 10s, &out).ok());
  for (const FileInfo& f : out) ASSERT_EQ(f.state, FileState::kFailed);
  // Nothing is being persisted, so there is nothing to wait for: refused at once.
  auto t0 = std::chrono::steady_clock::now();
  Status s = TryAllocate(root_ + "/u3.pt");
  EXPECT_EQ(s.code(), Status::Code::kResourceExhausted) << s.ToString();
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 20s);  // it did not wait out full_timeout
  for (const FileInfo& f : cache_testing::Files(*cache_, "job", "")) EXPECT_EQ(f.state, FileState::kFailed);
}

TEST_F(EvictionTest, FullCacheWaitsForPersistenceToFreeRoom) {
  StartSmall(20s);
  env_.FailAppends(EIO, 2);  // the first writes fail once, then recover after backoff
  for (int i = 0; i < 3; ++i) Save(root_ + "/w" + std::to_string(i) + ".pt", 'w');
  Status s = TryAllocate(root_ + "/w3.pt");  // blocks until some file is persisted
  EXPECT_TRUE(s.ok()) << s.ToString();
  EXPECT_GE(cache_->Stats().evicted_files, 1u);
}

}  // namespace
}  // namespace tce

namespace tce {
namespace {

TEST_F(PersisterTest, KeepLastEvictsOlderTagsOncePersisted) {
  CacheOptions co = DiskCache();
  co.full_timeout = 1s;
  co.keep_last = 2;
  PersistOptions o;
  o.backoff = 5ms;
  o.retries = 0;
  Build(co, o);
  env_.FailAppends(EIO, 2);  // step1's two files fail: FAILED files are never evicted
  for (int step = 1; step <= 4; ++step) {
    for (const char* rank : {"r0", "r1"}) {
      std::string path = root_ + "/step" + std::to_string(step) + "/" + rank + ".pt";
      Save(path, 'k', "step" + std::to_string(step));
      std::vector<FileInfo> out;
      ASSERT_TRUE(Wait(path, &out).ok());
    }
  }
  std::map<std::string, FileState> states;
  for (const FileInfo& f : cache_testing::Files(*cache_, "job", "")) states[f.tag + "/" + f.path.substr(f.path.rfind('/') + 1)] = f.state;
  EXPECT_EQ(states["step1/r0.pt"], FileState::kFailed);
  EXPECT_EQ(states["step1/r1.pt"], FileState::kFailed);
  EXPECT_EQ(states["step2/r0.pt"], FileState::kEvicted);
  EXPECT_EQ(states["step2/r1.pt"], FileState::kEvicted);
  EXPECT_EQ(states["step3/r0.pt"], FileState::kPersisted);
  EXPECT_EQ(states["step4/r1.pt"], FileState::kPersisted);
}

}  // namespace
}  // namespace tce

namespace tce {
namespace {

TEST_F(PersisterTest, WritesWithTheClientsIdentity) {
  if (geteuid() != 0) GTEST_SKIP() << "needs root to act as another uid";
  const uid_t nobody = 65534;
  Start(/*retries=*/0);
  session_ = cache_->sessions()->OpenSession(nobody, getpid(), nobody);
  fs::create_directories(root_ + "/theirs");
  ASSERT_EQ(chown((root_ + "/theirs").c_str(), nobody, nobody), 0);
  fs::permissions(root_, fs::perms::owner_all | fs::perms::group_read | fs::perms::group_exec |
                             fs::perms::others_read | fs::perms::others_exec);
  std::string allowed = root_ + "/theirs/ok.pt", denied = root_ + "/root-owned.pt";
  Save(allowed, 'n');
  Save(denied, 'r');
  std::vector<FileInfo> out;
  ASSERT_TRUE(cache_->Wait(session_, "job", {allowed, denied}, 10s, &out).ok());
  EXPECT_EQ(out[0].state, FileState::kPersisted) << out[0].reason;
  EXPECT_EQ(out[1].state, FileState::kFailed);
  EXPECT_NE(out[1].reason.find("Permission denied"), std::string::npos) << out[1].reason;
  struct stat st;
  ASSERT_EQ(stat(allowed.c_str(), &st), 0);
  EXPECT_EQ(st.st_uid, nobody);  // the client's file, not root's
  EXPECT_FALSE(fs::exists(denied));
}

}  // namespace
}  // namespace tce

namespace tce {
namespace {

TEST(Restore, RecordedFilesComeBackWithoutMemory) {
  Cache cache(1 << 20);
  FileInfo persisted, cached;
  persisted.job = cached.job = "job";
  persisted.path = "/c/p.pt";
  persisted.state = FileState::kPersisted;
  persisted.buffer_id = 7;  // a buffer id from the old server: must not be trusted
  cached.path = "/c/c.pt";
  cached.state = FileState::kCached;
  cached.version = 41;
  persisted.owner_uid = cached.owner_uid = 1;  // the job stays theirs across the restart
  cache.Restore({persisted, cached});
  std::string s = cache.sessions()->OpenSession(1, 1);
  FileInfo f;
  uint64_t lease;
  std::vector<uint64_t> unmap;
  Status st = cache.Lookup(s, "job", "/c/p.pt", true, &f, &lease, &unmap);
  EXPECT_EQ(st.code(), Status::Code::kNotFound);
  EXPECT_NE(st.message().find("evicted"), std::string::npos);
  st = cache.Lookup(s, "job", "/c/c.pt", true, &f, &lease, &unmap);
  EXPECT_EQ(st.code(), Status::Code::kNotFound);
  EXPECT_NE(st.message().find("lost: the server restarted"), std::string::npos) << st.message();
  EXPECT_EQ(cache.Stats().buffers, 0u);
  EXPECT_EQ(cache.Stats().leases, 0u);
  AllocateResult a;  // allocation ids continue after the recorded versions
  ASSERT_TRUE(cache.Allocate({s, "job", "t", "/c/c.pt", 0, 100}, &a).ok());
  EXPECT_GT(a.allocation_id, 41u);
  ASSERT_TRUE(cache.Commit(s, a.allocation_id, {}, &f).ok());  // a new save replaces the lost entry
  EXPECT_TRUE(cache.Lookup(s, "job", "/c/c.pt", false, &f, &lease, &unmap).ok());
  std::string other = cache.sessions()->OpenSession(2, 2);
  EXPECT_EQ(cache.Lookup(other, "job", "/c/c.pt", false, &f, &lease, &unmap).code(),
            Status::Code::kPermissionDenied);
}

}  // namespace
}  // namespace tce

namespace tce {
namespace {

TEST_F(PersisterTest, RetryAfterAFailureMidFileKeepsTheCrcsRight) {
  PosixStoreOptions file;
  file.chunk = 4096;  // a file of several chunks
  CacheOptions co = DiskCache();
  co.storage = DiskRoots(file);
  PersistOptions o;
  o.backoff = 5ms;
  o.retries = 2;
  Build(co, o);
  const uint64_t kPayload = 20000, kData = 64, kDesc = kData + kPayload, kCentral = kDesc + 24,
                 kSize = kCentral + 64;
  env_.FailAppends(ENOSPC, 1, /*skip=*/2);  // the 3rd chunk of the first attempt fails
  std::string path = root_ + "/multi.pt";
  std::vector<unsigned char> bytes(kSize, 0);
  for (uint64_t i = kData; i < kDesc; ++i) bytes[i] = static_cast<unsigned char>(i * 31);
  std::memcpy(&bytes[kDesc], "PK\x07\x08", 4);
  std::memcpy(&bytes[kCentral], "PK\x01\x02", 4);
  ASSERT_NO_FATAL_FAILURE(CommitBytes(path, bytes, {{"x/data/0", 0, kData, kPayload, 0, kCentral}}));
  std::vector<FileInfo> out;
  ASSERT_TRUE(Wait(path, &out).ok());
  ASSERT_EQ(out[0].state, FileState::kPersisted) << out[0].reason;
  std::string disk = Read(path);
  uint32_t crc = crc32(0, &bytes[kData], kPayload);
  EXPECT_EQ(Get32(disk, kDesc + 4), crc);
  EXPECT_EQ(Get32(disk, kCentral + 16), crc);
  EXPECT_EQ(out[0].records[0].crc32, crc);
  EXPECT_GE(env_.appends(), 8);  // 5 chunks, the first attempt stopped at the 3rd
}

TEST_F(PersisterTest, PersistenceWaitsForSavesInFlight) {
  manual_clock_ = true;  // never advanced: the persister's yield never times out
  Start();
  AllocateResult in_flight;  // a training rank is copying into this one
  ASSERT_TRUE(cache_->Allocate({session_, "job", "t", root_ + "/busy.pt", 0, 4096}, &in_flight).ok());
  std::string path = root_ + "/waits.pt";
  Save(path, 'y');
  ASSERT_TRUE(Eventually([&] { return clock_.waits() > 0; }));  // a worker yields to the save
  for (const FileInfo& f : cache_testing::Files(*cache_, "job", ""))
    if (f.path == path) EXPECT_EQ(f.state, FileState::kCached);  // not written meanwhile
  EXPECT_EQ(env_.appends(), 0);
  std::vector<FileInfo> out;
  ASSERT_TRUE(cache_->Abort(session_, in_flight.allocation_id).ok());  // the save is done
  ASSERT_TRUE(Wait(path, &out).ok());
  EXPECT_EQ(out[0].state, FileState::kPersisted);
}

TEST_F(PersisterTest, WritesInFlightGiveTheSameFileAsOneAtATime) {
  std::string disk[2];
  uint32_t crc[2] = {0, 0};
  const uint64_t kPayload = 300000, kData = 64, kDesc = kData + kPayload, kCentral = kDesc + 24,
                 kSize = kCentral + 64;
  std::vector<unsigned char> bytes(kSize, 0);
  for (uint64_t i = kData; i < kDesc; ++i) bytes[i] = static_cast<unsigned char>(i * 131 + i / 7);
  std::memcpy(&bytes[kDesc], "PK\x07\x08", 4);
  std::memcpy(&bytes[kCentral], "PK\x01\x02", 4);
  for (int depth : {1, 8}) {
    persister_.reset();
    PosixStoreOptions file;
    file.chunk = 8192;  // 38 chunks
    file.io_depth = depth;
    CacheOptions co = DiskCache();
    co.storage = DiskRoots(file);
    PersistOptions o;
    Build(co, o);
    std::string path = root_ + "/depth" + std::to_string(depth) + ".pt";
    ASSERT_NO_FATAL_FAILURE(CommitBytes(path, bytes, {{"x/data/0", 0, kData, kPayload, 0, kCentral}}));
    std::vector<FileInfo> out;
    ASSERT_TRUE(Wait(path, &out).ok());
    ASSERT_EQ(out[0].state, FileState::kPersisted) << out[0].reason;
    disk[depth > 1] = Read(path);
    crc[depth > 1] = out[0].records[0].crc32;
  }
  ASSERT_EQ(disk[0].size(), kSize);
  EXPECT_EQ(disk[0], disk[1]);
  EXPECT_EQ(crc[0], crc32(0, &bytes[kData], kPayload));
  EXPECT_EQ(crc[1], crc[0]);
  EXPECT_EQ(Get32(disk[1], kCentral + 16), crc[0]);
}

}  // namespace
}  // namespace tce

namespace tce {
namespace {

TEST_F(PersisterTest, AFailureThatClearsIsPersistedAgain) {
  Start(/*retries=*/0, /*direct_io=*/true, /*run=*/true, /*failed_retry=*/50ms);
  env_.FailAppends(ENOSPC, 3);  // the first attempts find the disk full
  const std::string path = root_ + "/full.pt";
  Save(path, 'f');
  std::vector<FileInfo> out;
  ASSERT_TRUE(Wait(path, &out).ok());
  ASSERT_EQ(out[0].state, FileState::kFailed);
  EXPECT_NE(out[0].reason.find("RESOURCE_EXHAUSTED"), std::string::npos) << out[0].reason;
  EXPECT_NE(out[0].reason.find("persisted again every"), std::string::npos) << out[0].reason;
  // The disk has room again: a later attempt persists it, with no client asking.
  const auto deadline = std::chrono::steady_clock::now() + 10s;
  FileInfo f;
  do {
    std::this_thread::sleep_for(20ms);
    for (const FileInfo& g : cache_testing::Files(*cache_, "job", "")) f = g;
  } while (f.state != FileState::kPersisted && std::chrono::steady_clock::now() < deadline);
  EXPECT_EQ(f.state, FileState::kPersisted) << f.reason;
  EXPECT_EQ(Read(path)[FakeZip::kData], 'f');
}

TEST_F(PersisterTest, AFailureThatCannotClearIsNotRetried) {
  if (geteuid() != 0) GTEST_SKIP() << "needs root to act as another uid";
  manual_clock_ = true;
  Start(/*retries=*/0, /*direct_io=*/true, /*run=*/false, /*failed_retry=*/20ms);
  session_ = cache_->sessions()->OpenSession(65534, getpid(), 65534);
  const std::string path = root_ + "/x.pt";  // root's directory: PERMISSION_DENIED for nobody
  Save(path, 'g');
  persister_->Start();
  std::vector<FileInfo> out;
  ASSERT_TRUE(Wait(path, &out).ok());
  ASSERT_EQ(out[0].state, FileState::kFailed);
  EXPECT_EQ(out[0].reason.find("persisted again"), std::string::npos) << out[0].reason;
  // Far past the retry interval, a file queued after it is persisted (the
  // workers took every due retry before it): the failed one was not tried.
  clock_.Advance(1h);
  session_ = cache_->sessions()->OpenSession(getuid(), getpid());
  const std::string later = root_ + "/later.pt";
  Save(later, 'h');
  ASSERT_TRUE(Wait(later, &out).ok());
  ASSERT_EQ(out[0].state, FileState::kPersisted);
  for (const FileInfo& f : cache_testing::Files(*cache_, "job", ""))
    if (f.path == path) EXPECT_EQ(f.state, FileState::kFailed);

}

}  // namespace
}  // namespace tce
