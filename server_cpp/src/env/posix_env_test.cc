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

}  // namespace tce
