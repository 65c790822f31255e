// The cache and storage agree (docs/semantics.md): deletes are honoured,
// storage wins when it changed, the cache wins when storage failed, and a
// replaced file keeps its mode.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <thread>

#include "persist/persister_fixture.h"

namespace tce {
namespace {

class CoherenceTest : public PersisterTest {
 protected:
  // Loads `path`: OK with the cached copy, or why not.
  Status Load(const std::string& path) {
    FileInfo f;
    uint64_t lease = 0;
    std::vector<uint64_t> unmap;
    return cache_->Lookup(session_, "job", path, /*lease=*/false, &f, &lease, &unmap);
  }
  FileInfo Only(const std::string& path) {
    for (const FileInfo& f : cache_testing::Files(*cache_, "job", ""))
      if (f.path == path) return f;
    ADD_FAILURE() << path << " is not listed";
    return FileInfo();
  }
  void Persisted(const std::string& path) {
    std::vector<FileInfo> out;
    ASSERT_TRUE(Wait(path, &out).ok());
    ASSERT_EQ(out[0].state, FileState::kPersisted) << out[0].reason;
  }
  static mode_t ModeOf(const std::string& path) {
    struct stat st;
    return stat(path.c_str(), &st) == 0 ? st.st_mode & 07777 : 0;
  }
};

TEST_F(CoherenceTest, ASaveIntoAMissingDirectoryFailsAtOnceAndCreatesNothing) {
  Start();
  const std::string path = root_ + "/nope/x.pt";
  AllocateResult a;
  Status s = cache_->Allocate({session_, "job", "t", path, 0, FakeZip::kSize}, &a);
  EXPECT_EQ(s.code(), Status::Code::kNotFound) << s.ToString();
  EXPECT_NE(s.message().find("No such file or directory"), std::string::npos) << s.ToString();
  EXPECT_FALSE(fs::exists(root_ + "/nope"));
}

TEST_F(CoherenceTest, ADirectoryRemovedBeforePersistenceIsNotRecreated) {
  Start(/*retries=*/3, /*direct_io=*/true, /*run=*/false);
  const std::string path = root_ + "/step1/x.pt";
  Save(path, 'a');
  fs::remove_all(root_ + "/step1");  // shutil.rmtree right after the save
  persister_->Start();
  std::vector<FileInfo> out;
  ASSERT_TRUE(Wait(path, &out).ok());
  EXPECT_EQ(out[0].state, FileState::kDiscarded);
  EXPECT_NE(out[0].reason.find("was removed"), std::string::npos) << out[0].reason;
  EXPECT_EQ(out[0].buffer_id, 0u);  // its memory is free
  EXPECT_FALSE(fs::exists(root_ + "/step1"));
  EXPECT_EQ(cache_->Stats().discarded_files, 1u);
  EXPECT_EQ(Load(path).code(), Status::Code::kNotFound);  // loads read storage (nothing there)
  EXPECT_FALSE(fs::exists(root_ + "/step1"));  // and with its memory gone, nothing ever writes it
}

TEST_F(CoherenceTest, ARenamedDirectoryLeavesNothingAtEitherName) {
  Start(/*retries=*/3, /*direct_io=*/true, /*run=*/false);
  const std::string path = root_ + "/step1/x.pt";
  Save(path, 'a');
  fs::rename(root_ + "/step1", root_ + "/moved");
  persister_->Start();
  std::vector<FileInfo> out;
  ASSERT_TRUE(Wait(path, &out).ok());
  EXPECT_EQ(out[0].state, FileState::kDiscarded) << out[0].reason;
  EXPECT_FALSE(fs::exists(root_ + "/step1"));
  EXPECT_TRUE(fs::is_empty(root_ + "/moved"));
}

TEST_F(CoherenceTest, AFileDeletedBeforePersistenceIsNotRecreated) {
  Start(/*retries=*/3, /*direct_io=*/true, /*run=*/false);
  const std::string path = root_ + "/x.pt";
  { std::ofstream(path) << "the previous checkpoint"; }
  Save(path, 'a');
  fs::remove(path);  // os.remove right after the save
  persister_->Start();
  std::vector<FileInfo> out;
  ASSERT_TRUE(Wait(path, &out).ok());
  EXPECT_EQ(out[0].state, FileState::kDiscarded);
  EXPECT_NE(out[0].reason.find("was deleted"), std::string::npos) << out[0].reason;
  EXPECT_FALSE(fs::exists(path));
}

TEST_F(CoherenceTest, AFileWrittenByAnotherToolBeforePersistenceWins) {
  Start(/*retries=*/3, /*direct_io=*/true, /*run=*/false);
  const std::string path = root_ + "/x.pt";
  Save(path, 'a');
  { std::ofstream(path) << "rsync put this here"; }
  persister_->Start();
  std::vector<FileInfo> out;
  ASSERT_TRUE(Wait(path, &out).ok());
  EXPECT_EQ(out[0].state, FileState::kDiscarded);
  EXPECT_EQ(Read(path), "rsync put this here");
}

TEST_F(CoherenceTest, ALoadDropsTheCachedCopyOfAFileReplacedOnStorage) {
  Start();
  const std::string path = root_ + "/x.pt";
  Save(path, 'a');
  Persisted(path);
  ASSERT_TRUE(Load(path).ok());  // unchanged: the cache serves it
  const std::string other = root_ + "/other";
  { std::ofstream(other) << "another checkpoint"; }
  fs::rename(other, path);  // replaced by another process
  Status s = Load(path);
  EXPECT_EQ(s.code(), Status::Code::kNotFound) << s.ToString();
  FileInfo f = Only(path);
  EXPECT_EQ(f.state, FileState::kEvicted);
  EXPECT_NE(f.reason.find("was replaced"), std::string::npos) << f.reason;
  EXPECT_EQ(f.buffer_id, 0u);
  EXPECT_EQ(cache_->Stats().stale_drops, 1u);
  EXPECT_EQ(Read(path), "another checkpoint");
}

TEST_F(CoherenceTest, ALoadOfAFileDeletedOnStorageIsNotServed) {
  Start();
  const std::string path = root_ + "/x.pt";
  Save(path, 'a');
  Persisted(path);
  fs::remove(path);
  EXPECT_EQ(Load(path).code(), Status::Code::kNotFound);
  EXPECT_EQ(Only(path).state, FileState::kEvicted);
}

TEST_F(CoherenceTest, AListCheckingStorageDropsWhatWasDeleted) {
  Start();
  const std::string kept = root_ + "/kept.pt", gone = root_ + "/gone.pt";
  Save(kept, 'k');
  Save(gone, 'g');
  Persisted(kept);
  Persisted(gone);
  fs::remove(gone);
  std::vector<FileInfo> listed;
  ASSERT_TRUE(cache_->List(session_, "job", "", &listed, /*check_storage=*/true).ok());
  ASSERT_EQ(listed.size(), 2u);
  for (const FileInfo& f : listed) {
    if (f.path == kept) EXPECT_NE(f.buffer_id, 0u);
    if (f.path == gone) EXPECT_EQ(f.buffer_id, 0u);
  }
}

TEST_F(CoherenceTest, StorageErrorsServeTheCache) {
  Start();
  const std::string path = root_ + "/x.pt";
  Save(path, 'a');
  Persisted(path);
  env_.FailStats(EIO);
  EXPECT_TRUE(Load(path).ok());
  env_.FailStats(ESTALE);
  EXPECT_TRUE(Load(path).ok());
  env_.FailStats(0);
  EXPECT_EQ(cache_->Stats().storage_fallbacks, 2u);
  EXPECT_EQ(Only(path).state, FileState::kPersisted);
}

TEST_F(CoherenceTest, HungStorageServesTheCacheAfterTheTimeout) {
  check_timeout_ = 100ms;
  Start();
  const std::string path = root_ + "/x.pt";
  Save(path, 'a');
  Persisted(path);
  env_.BlockStats();  // until after the load: a load that waited for the stat would never return
  const auto t0 = std::chrono::steady_clock::now();
  Status s = Load(path);
  const auto took = std::chrono::steady_clock::now() - t0;
  env_.UnblockStats();
  EXPECT_TRUE(s.ok()) << s.ToString();
  EXPECT_GE(took, 100ms);  // it gave the storage its timeout
  EXPECT_EQ(cache_->Stats().storage_fallbacks, 1u);
}

TEST_F(CoherenceTest, AReplacedFileKeepsItsModeAndANewOneGetsTheSaversMode) {
  Start();
  const std::string old_path = root_ + "/old.pt", new_path = root_ + "/new.pt";
  { std::ofstream(old_path) << "previous"; }
  ASSERT_EQ(chmod(old_path.c_str(), 0600), 0);
  Save(old_path, 'o');
  Finish(Begin(new_path, "t", /*mode=*/0640), 'n');  // 0666 & ~027
  Persisted(old_path);
  Persisted(new_path);
  EXPECT_EQ(ModeOf(old_path), 0600u);
  EXPECT_EQ(ModeOf(new_path), 0640u);
  EXPECT_EQ(Read(old_path)[FakeZip::kData], 'o');
}

TEST_F(CoherenceTest, WithoutZipCrcsTheHeadersKeepZeroAndTheRecordsGetTheCrcs) {
  Start();
  const std::string path = root_ + "/x.pt";
  Finish(Begin(path), 'c', /*zip_crc32=*/false);
  Persisted(path);
  const std::string bytes = Read(path);
  EXPECT_EQ(Get32(bytes, FakeZip::kDesc + 4), 0u);
  EXPECT_EQ(Get32(bytes, FakeZip::kCentral + 16), 0u);
  EXPECT_NE(Only(path).records[0].crc32, 0u);
}

TEST_F(CoherenceTest, AnOlderVersionPersistedDuringASaveDoesNotDiscardIt) {
  Start(/*retries=*/3, /*direct_io=*/true, /*run=*/false);
  const std::string path = root_ + "/x.pt";
  Save(path, '1');
  // Version 2 looks at storage (nothing there yet) ...
  AllocateResult a = Begin(path);
  // ... then version 1 lands ...
  persister_->Start();
  Persisted(path);
  // ... and version 2 commits: it replaces what this server wrote.
  Finish(a, '2');
  Persisted(path);
  EXPECT_EQ(Read(path)[FakeZip::kData], '2');
}


// Persistence yields while a save is being written into the cache: a second
// allocation, never committed, holds a file's write open at its first chunk.
class HeldCoherenceTest : public CoherenceTest {
 protected:
  // The yield never times out (clock_ is never advanced): the write stays
  // held until Release.
  HeldCoherenceTest() { manual_clock_ = true; }
  // Saves `path` (committed), then waits until a worker has the file's
  // directory open and yields to the held save: a timed wait begun after
  // the allocation's own look at storage (which waits on the clock too).
  void SaveAndAwaitYield(const std::string& path) {
    const AllocateResult a = Begin(path);
    const uint64_t before = clock_.waits();
    Finish(a, 'a');
    ASSERT_TRUE(Eventually([&] { return clock_.waits() > before; }));
  }
  void Hold() {
    ASSERT_TRUE(cache_->Allocate({session_, "job", "t", root_ + "/held.pt", 0, FakeZip::kSize}, &hold_).ok());
  }
  void Release() { ASSERT_TRUE(cache_->Abort(session_, hold_.allocation_id).ok()); }
  AllocateResult hold_;
};

TEST_F(HeldCoherenceTest, ADirectoryRemovedWhileItsFileIsWrittenGetsNothing) {
  Start();
  Hold();
  const std::string path = root_ + "/step1/x.pt";
  SaveAndAwaitYield(path);
  fs::remove_all(root_ + "/step1");
  Release();
  std::vector<FileInfo> out;
  ASSERT_TRUE(Wait(path, &out).ok());
  EXPECT_EQ(out[0].state, FileState::kDiscarded) << out[0].reason;
  EXPECT_FALSE(fs::exists(root_ + "/step1"));
}

TEST_F(HeldCoherenceTest, ADirectoryMovedWhileItsFileIsWrittenGetsNothing) {
  Start();
  Hold();
  const std::string path = root_ + "/step1/x.pt";
  SaveAndAwaitYield(path);
  fs::rename(root_ + "/step1", root_ + "/moved");
  Release();
  std::vector<FileInfo> out;
  ASSERT_TRUE(Wait(path, &out).ok());
  EXPECT_EQ(out[0].state, FileState::kDiscarded) << out[0].reason;
  EXPECT_FALSE(fs::exists(root_ + "/step1"));
  EXPECT_TRUE(fs::is_empty(root_ + "/moved"));
}

}  // namespace
}  // namespace tce
