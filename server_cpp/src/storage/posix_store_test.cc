// PosixStore through the storage interface (storage/object_store.h): the
// factory picks it by the file:// scheme, and every call stays beneath the
// root. The persister's coherence through it is covered by
// persist/persister_test.cc and persist/coherence_test.cc.
#include "storage/posix_store.h"

#include "storage/backends.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>

#include <filesystem>
#include <fstream>
#include <iterator>

#include "common/testing.h"
#include "env/fault_env.h"

namespace tce {
namespace fs = std::filesystem;
namespace {

std::string ReadAll(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

class PosixStoreTest : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = fs::canonical(MakeTempDir("tce-pstore")).string();
    StorageOptions o;
    o.file.env = Env::Default();
    o.file.chunk = 4096;  // several chunks per file
    std::string prefix;
    Status s = OpenObjectStore("file://" + root_, o, &store_, &prefix);
    ASSERT_TRUE(s.ok()) << s.ToString();
    EXPECT_EQ(prefix, "");
  }
  void TearDown() override { fs::remove_all(root_); }

  Status Put(const std::string& key, const std::string& bytes, WriteOptions w = WriteOptions(),
             FileStat* out = nullptr) {
    FileStat st;
    return store_->Write(key, bytes.data(), bytes.size(), w, out ? out : &st);
  }

  std::string root_;
  std::shared_ptr<ObjectStore> store_;
};

TEST_F(PosixStoreTest, TheFactoryPicksItByTheFileSchemeAndRefusesARelativeRoot) {
  EXPECT_NE(dynamic_cast<PosixStore*>(store_.get()), nullptr);
  EXPECT_EQ(store_->Url("a/x.pt"), root_ + "/a/x.pt");
  StorageOptions o;
  o.file.env = Env::Default();
  std::shared_ptr<ObjectStore> other;
  std::string prefix;
  Status s = OpenObjectStore("file://relative/dir", o, &other, &prefix);
  EXPECT_EQ(s.code(), Status::Code::kInvalidArgument);
  EXPECT_NE(s.message().find("want file:///ABSOLUTE/DIR"), std::string::npos) << s.message();
}

TEST_F(PosixStoreTest, WritesReadsStatsListsAndDeletesBytesExactly) {
  std::string bytes(3 * 4096 + 17, '\0');
  for (size_t i = 0; i < bytes.size(); ++i) bytes[i] = static_cast<char>(i * 7 + 3);
  WriteOptions w;
  w.create_dirs = true;
  std::vector<uint64_t> prepared;
  w.prepare = [&](uint64_t end) { prepared.push_back(end); };
  FileStat written;
  Status s = Put("run/step1/x.pt", bytes, w, &written);
  ASSERT_TRUE(s.ok()) << s.ToString();
  EXPECT_EQ(ReadAll(root_ + "/run/step1/x.pt"), bytes);
  EXPECT_EQ(written.size, bytes.size());
  EXPECT_EQ(prepared, (std::vector<uint64_t>{4096, 8192, 12288, bytes.size()}));  // before each chunk
  ASSERT_TRUE(Put("run/step1/y.pt", "yy", w).ok());
  ASSERT_TRUE(Put("run/step2/x.pt", "z", w).ok());

  ObjectId id;
  ASSERT_TRUE(store_->Stat("run/step1/x.pt", &id).ok());
  EXPECT_TRUE(id.exists);
  EXPECT_EQ(id.size, bytes.size());
  EXPECT_EQ(id.etag, PosixStore::EtagOf(written));
  std::string part(100, '\0');
  ASSERT_TRUE(store_->Read("run/step1/x.pt", 4000, part.size(), &part[0], id.etag, Requester()).ok());
  EXPECT_EQ(part, bytes.substr(4000, 100));
  s = store_->Read("run/step1/x.pt", bytes.size() - 10, 20, &part[0], "", Requester());
  EXPECT_EQ(s.code(), Status::Code::kOutOfRange) << s.ToString();

  std::vector<ListedObject> listed;
  ASSERT_TRUE(store_->List("run/step1/", Requester(), &listed).ok());
  ASSERT_EQ(listed.size(), 2u);
  EXPECT_EQ(listed[0].key, "run/step1/x.pt");
  EXPECT_EQ(listed[0].size, bytes.size());
  EXPECT_EQ(listed[1].key, "run/step1/y.pt");
  ASSERT_TRUE(store_->List("run/step", Requester(), &listed).ok());
  EXPECT_EQ(listed.size(), 3u);

  ASSERT_TRUE(store_->Delete("run/step1/x.pt", Requester()).ok());
  ASSERT_TRUE(store_->Delete("run/step1/x.pt", Requester()).ok());  // absent: OK
  ASSERT_TRUE(store_->Stat("run/step1/x.pt", &id).ok());
  EXPECT_FALSE(id.exists);
  s = store_->Read("run/step1/x.pt", 0, 1, &part[0], "", Requester());
  EXPECT_EQ(s.code(), Status::Code::kNotFound) << s.ToString();
}

// Direct writes, io_depth at a time, into blocks reserved first: the file
// holds exactly the bytes (the reservation's padding truncated away); a
// disk too full for the reservation fails the write before any byte goes
// out, leaving nothing behind; a filesystem without fallocate writes on.
class PosixStoreDirectTest : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = fs::canonical(MakeTempDir("tce-pstore-direct")).string();
    StorageOptions o;
    o.file.env = &env_;
    o.file.chunk = 2 * 4096;
    o.file.direct_io = true;
    o.file.io_depth = 4;
    std::string prefix;
    ASSERT_TRUE(OpenObjectStore("file://" + root_, o, &store_, &prefix).ok());
    const size_t n = 9 * 4096 + 123;  // not whole blocks: the tail is truncated
    void* p = nullptr;
    ASSERT_EQ(posix_memalign(&p, 4096, 10 * 4096), 0);
    data_ = static_cast<char*>(p);
    for (size_t i = 0; i < 10 * 4096; ++i) data_[i] = static_cast<char>(i * 13 + 5);
    bytes_.assign(data_, n);
  }
  void TearDown() override {
    std::free(data_);
    fs::remove_all(root_);
  }
  Status Put(const std::string& key) {
    WriteOptions w;
    w.readable = 10 * 4096;  // the buffer's whole blocks may be written
    FileStat st;
    return store_->Write(key, data_, bytes_.size(), w, &st);
  }

  FaultInjectionEnv env_{Env::Default()};
  std::string root_;
  std::shared_ptr<ObjectStore> store_;
  char* data_ = nullptr;
  std::string bytes_;
};

TEST_F(PosixStoreDirectTest, WritesIntoReservedBlocksAndKeepsExactlyTheBytes) {
  ASSERT_TRUE(Put("a.pt").ok());
  EXPECT_EQ(env_.preallocations(), 1);
  EXPECT_EQ(ReadAll(root_ + "/a.pt"), bytes_);
  EXPECT_EQ(fs::file_size(root_ + "/a.pt"), bytes_.size());
}

TEST_F(PosixStoreDirectTest, ADiskTooFullForTheReservationFailsBeforeAnyWrite) {
  env_.FailPreallocations(ENOSPC);
  Status s = Put("a.pt");
  EXPECT_EQ(s.code(), Status::Code::kResourceExhausted) << s.ToString();
  EXPECT_NE(s.message().find("No space left on device"), std::string::npos) << s.message();
  EXPECT_EQ(env_.appends(), 0);
  EXPECT_FALSE(fs::exists(root_ + "/a.pt"));
  EXPECT_TRUE(fs::is_empty(root_));  // no temp file left either
}

TEST_F(PosixStoreDirectTest, AFilesystemWithoutFallocateWritesOn) {
  env_.FailPreallocations(EOPNOTSUPP);
  ASSERT_TRUE(Put("a.pt").ok());
  EXPECT_EQ(env_.preallocations(), 1);
  EXPECT_EQ(ReadAll(root_ + "/a.pt"), bytes_);
}

TEST_F(PosixStoreTest, AReplacedFileFailsAReadPinnedToTheOldOne) {
  WriteOptions w;
  FileStat first;
  ASSERT_TRUE(Put("x.pt", "first", w, &first).ok());
  ASSERT_TRUE(Put("x.pt", "second!", w).ok());
  char buf[5];
  Status s = store_->Read("x.pt", 0, 5, buf, PosixStore::EtagOf(first), Requester());
  EXPECT_EQ(s.code(), Status::Code::kFailedPrecondition) << s.ToString();
  EXPECT_EQ(ReadAll(root_ + "/x.pt"), "second!");
}

TEST_F(PosixStoreTest, NothingGoesThroughASymlinkOrAboveTheRoot) {
  const std::string outside = MakeTempDir("tce-pstore-out");
  fs::create_symlink(outside, root_ + "/link");
  std::ofstream(outside + "/secret") << "s";
  WriteOptions w;
  w.create_dirs = true;
  Status s = Put("link/x.pt", "data", w);
  EXPECT_EQ(s.code(), Status::Code::kPermissionDenied) << s.ToString();
  EXPECT_FALSE(fs::exists(outside + "/x.pt"));
  char c;
  EXPECT_EQ(store_->Read("link/secret", 0, 1, &c, "", Requester()).code(), Status::Code::kPermissionDenied);
  fs::create_symlink(outside + "/secret", root_ + "/file-link");
  EXPECT_EQ(store_->Read("file-link", 0, 1, &c, "", Requester()).code(), Status::Code::kPermissionDenied);
  std::vector<ListedObject> listed;
  ASSERT_TRUE(store_->List("", Requester(), &listed).ok());
  EXPECT_TRUE(listed.empty());  // symlinks are not files of the root
  for (const char* bad : {"../x.pt", "a/../../x.pt", "/etc/passwd", "a//b", ""})
    EXPECT_EQ(Put(bad, "data", w).code(), Status::Code::kInvalidArgument) << bad;
  fs::remove_all(outside);
}

TEST_F(PosixStoreTest, AWriteGoesAheadOnlyWhileTheNameHoldsWhatTheSaveFound) {
  WriteOptions w;
  ASSERT_TRUE(Put("x.pt", "users", w).ok());
  struct stat dir_st, file_st;
  ASSERT_EQ(::stat(root_.c_str(), &dir_st), 0);
  ASSERT_EQ(::stat((root_ + "/x.pt").c_str(), &file_st), 0);
  DiskIdentity found;
  found.known = found.exists = true;
  found.dir_dev = dir_st.st_dev;
  found.dir_ino = dir_st.st_ino;
  found.dev = file_st.st_dev;
  found.ino = file_st.st_ino;
  found.size = file_st.st_size;
  found.mtime_ns = static_cast<int64_t>(file_st.st_mtim.tv_sec) * 1000000000 + file_st.st_mtim.tv_nsec;
  w.expected = &found;
  // The user replaces the file while the write is under way: the write is
  // refused and the user's file stays.
  w.prepare = [&](uint64_t) {
    fs::remove(root_ + "/x.pt");
    std::ofstream(root_ + "/x.pt") << "theirs";
  };
  Status s = Put("x.pt", "ours", w);
  EXPECT_EQ(s.code(), Status::Code::kCancelled) << s.ToString();
  EXPECT_EQ(ReadAll(root_ + "/x.pt"), "theirs");
  // The caller's own last look refuses with its own status.
  w.expected = nullptr;
  w.prepare = nullptr;
  w.before_commit = [] { return Status::Aborted("superseded by a newer version"); };
  s = Put("x.pt", "ours", w);
  EXPECT_EQ(s.code(), Status::Code::kAborted);
  EXPECT_EQ(ReadAll(root_ + "/x.pt"), "theirs");
  std::vector<ListedObject> listed;
  ASSERT_TRUE(store_->List("", Requester(), &listed).ok());
  ASSERT_EQ(listed.size(), 1u);  // no temp file left behind
}

TEST_F(PosixStoreTest, ANewFileGetsTheGivenModeAndAReplacedOneKeepsItsOwn) {
  WriteOptions w;
  w.new_mode = 0600;
  ASSERT_TRUE(Put("a.pt", "1", w).ok());
  EXPECT_EQ(fs::status(root_ + "/a.pt").permissions(), fs::perms::owner_read | fs::perms::owner_write);
  fs::permissions(root_ + "/a.pt", fs::perms::owner_read | fs::perms::owner_write | fs::perms::group_read);
  w.new_mode = 0644;
  ASSERT_TRUE(Put("a.pt", "2", w).ok());
  EXPECT_EQ(fs::status(root_ + "/a.pt").permissions(),
            fs::perms::owner_read | fs::perms::owner_write | fs::perms::group_read);
}

}  // namespace
}  // namespace tce
