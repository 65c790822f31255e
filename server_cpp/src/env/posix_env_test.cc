#include <gtest/gtest.h>

#include "common/testing.h"
#include <stdlib.h>
#include <unistd.h>

#include <filesystem>
#include <cstring>
#include <fstream>

#include "env/env.h"

namespace tce {
namespace fs = std::filesystem;

TEST(PosixEnv, CreateDirsAndResolve) {
  std::string dir = MakeTempDir("tce-env");
  Env* env = Env::Default();
  ASSERT_TRUE(env->CreateDirs(dir + "/a/b").ok());
  EXPECT_TRUE(fs::is_directory(dir + "/a/b"));

  // A symlink inside a root that points outside it resolves outside.
  fs::create_symlink("/etc", dir + "/escape");
  std::string resolved;
  ASSERT_TRUE(env->ResolvePath(dir + "/escape/new/file.pt", &resolved).ok());
  EXPECT_EQ(resolved, "/etc/new/file.pt");
  ASSERT_TRUE(env->ResolvePath(dir + "/not/yet/there.pt", &resolved).ok());
  EXPECT_EQ(resolved, fs::canonical(dir).string() + "/not/yet/there.pt");
  fs::remove_all(dir);
}

TEST(PosixEnv, DirectWritesAlignedBlocksThenTruncates) {
  std::string dir = MakeTempDir("tce-envd");
  Env* env = Env::Default();
  std::unique_ptr<Directory> d;
  ASSERT_TRUE(env->OpenDirectory(dir, dir, /*create=*/false, &d).ok());
  std::unique_ptr<TempFile> f;
  Status s = d->NewTempFile(".tce-test.", /*direct=*/true, &f);
  if (s.code() == Status::Code::kUnimplemented) GTEST_SKIP() << s.message();
  ASSERT_TRUE(s.ok()) << s.ToString();
  void* block = aligned_alloc(4096, 8192);
  std::memset(block, 'q', 8192);
  ASSERT_TRUE(f->Append(static_cast<const char*>(block), 8192).ok());
  ASSERT_TRUE(f->Truncate(5000).ok());
  ASSERT_TRUE(f->Sync().ok());
  ASSERT_TRUE(f->Publish("d").ok());
  ASSERT_TRUE(f->Close().ok());
  free(block);
  EXPECT_EQ(fs::file_size(dir + "/d"), 5000u);
  fs::remove_all(dir);
}

// Descriptors of this process that still reach the removed file once at `path`.
int HeldDeleted(const std::string& path) {
  int n = 0;
  for (const auto& e : fs::directory_iterator("/proc/self/fd")) {
    std::error_code ec;
    if (fs::read_symlink(e.path(), ec).string() == path + " (deleted)") ++n;
  }
  return n;
}

TEST(PosixEnv, PublishHoldsTheReplacedFileUntilTheTempFileIsDestroyed) {
  const std::string dir = fs::canonical(MakeTempDir("tce-envr")).string();
  Env* env = Env::Default();
  std::unique_ptr<Directory> d;
  ASSERT_TRUE(env->OpenDirectory(dir, dir, /*create=*/false, &d).ok());
  std::ofstream(dir + "/final") << "old";
  std::unique_ptr<TempFile> f;
  ASSERT_TRUE(d->NewTempFile(".tce-test.", /*direct=*/false, &f).ok());
  ASSERT_TRUE(f->Append("new", 3).ok());
  ASSERT_TRUE(f->Sync().ok());
  ASSERT_TRUE(f->Publish("final").ok());
  ASSERT_TRUE(f->Close().ok());
  ASSERT_TRUE(d->Sync().ok());
  std::ifstream in(dir + "/final");
  EXPECT_EQ(std::string(std::istreambuf_iterator<char>(in), {}), "new");
  // The old version's blocks are freed when the writer lets go, not in the rename.
  EXPECT_EQ(HeldDeleted(dir + "/final"), 1);
  f.reset();
  EXPECT_EQ(HeldDeleted(dir + "/final"), 0);
  fs::remove_all(dir);
}

}  // namespace tce

namespace tce {
namespace fs = std::filesystem;

TEST(PosixEnv, OpenDirectoryStaysBeneathItsRootAndFollowsNoSymlink) {
  const std::string root = MakeTempDir("tce-env-root"), outside = MakeTempDir("tce-env-out");
  Env* env = Env::Default();
  std::unique_ptr<Directory> d;
  ASSERT_TRUE(env->OpenDirectory(root, root + "/a/b", /*create=*/true, &d).ok());
  EXPECT_TRUE(fs::is_directory(root + "/a/b"));
  std::unique_ptr<TempFile> f;
  ASSERT_TRUE(d->NewTempFile(".tce-test.", /*direct=*/false, &f).ok());
  ASSERT_TRUE(f->Append("hello", 5).ok());
  ASSERT_TRUE(f->Sync().ok());
  ASSERT_TRUE(f->Publish("final").ok());
  ASSERT_TRUE(f->Close().ok());
  ASSERT_TRUE(d->Sync().ok());
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(root + "/a/b")) names.push_back(e.path().filename());
  EXPECT_EQ(names, std::vector<std::string>{"final"});
  EXPECT_EQ(f->Publish("x/y").code(), Status::Code::kInvalidArgument);

  fs::create_directory_symlink(outside, root + "/a/link");
  Status s = env->OpenDirectory(root, root + "/a/link/c", /*create=*/true, &d);
  EXPECT_EQ(s.code(), Status::Code::kPermissionDenied) << s.ToString();
  EXPECT_TRUE(fs::is_empty(outside));
  EXPECT_EQ(env->OpenDirectory(root, outside, true, &d).code(), Status::Code::kInvalidArgument);
  EXPECT_EQ(env->OpenDirectory(root, root + "/a/../a", true, &d).code(), Status::Code::kInvalidArgument);
  EXPECT_EQ(env->OpenDirectory(root, root + "/missing", /*create=*/false, &d).code(), Status::Code::kNotFound);
  fs::remove_all(root);
  fs::remove_all(outside);
}

TEST(PosixEnv, ReadPiecesHandsOverTheBytesInOrderThroughOneOpen) {
  std::string dir = MakeTempDir("tce-envp");
  std::string bytes(1000, '\0');
  for (size_t i = 0; i < bytes.size(); ++i) bytes[i] = static_cast<char>(i * 7 + 3);
  std::ofstream(dir + "/f", std::ios::binary) << bytes;
  fs::create_symlink(dir + "/f", dir + "/link");
  std::unique_ptr<Directory> d;
  ASSERT_TRUE(Env::Default()->OpenDirectory(dir, dir, /*create=*/false, &d).ok());

  std::string got;
  std::vector<std::pair<uint64_t, size_t>> pieces;
  Status s = d->ReadPieces("f", 100, 850, 256, [&](uint64_t off, const char* data, size_t n) {
    pieces.emplace_back(off, n);
    got.append(data, n);
    return Status::OK();
  });
  ASSERT_TRUE(s.ok()) << s.ToString();
  EXPECT_EQ(got, bytes.substr(100, 850));
  EXPECT_EQ(pieces, (std::vector<std::pair<uint64_t, size_t>>{{100, 256}, {356, 256}, {612, 256}, {868, 82}}));

  // A read past the end, a symlink, a sink that fails: each ends the read.
  size_t calls = 0;
  auto count = [&](uint64_t, const char*, size_t) { ++calls; return Status::OK(); };
  s = d->ReadPieces("f", 900, 200, 64, count);
  EXPECT_EQ(s.code(), Status::Code::kOutOfRange) << s.ToString();
  EXPECT_NE(s.message().find("ends before byte 1100"), std::string::npos) << s.message();
  EXPECT_EQ(d->ReadPieces("link", 0, 10, 64, count).code(), Status::Code::kPermissionDenied);
  EXPECT_EQ(d->ReadPieces("none", 0, 10, 64, count).code(), Status::Code::kNotFound);
  EXPECT_EQ(d->ReadPieces("f", 0, 10, 0, count).code(), Status::Code::kInvalidArgument);
  calls = 0;
  s = d->ReadPieces("f", 0, 1000, 100, [&](uint64_t, const char*, size_t) {
    return ++calls == 2 ? Status::ResourceExhausted("full") : Status::OK();
  });
  EXPECT_EQ(s.code(), Status::Code::kResourceExhausted);
  EXPECT_EQ(calls, 2u);
  fs::remove_all(dir);
}


}  // namespace tce
