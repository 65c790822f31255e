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

TEST(PosixEnv, WriteRenameRemoveAndResolve) {
  std::string dir = MakeTempDir("tce-env");
  Env* env = Env::Default();
  ASSERT_TRUE(env->CreateDirs(dir + "/a/b").ok());
  std::unique_ptr<WritableFile> f;
  ASSERT_TRUE(env->NewWritableFile(dir + "/a/b/tmp", /*direct=*/false, &f).ok());
  ASSERT_TRUE(f->Append("hello", 5).ok());
  ASSERT_TRUE(f->Sync().ok());
  ASSERT_TRUE(f->Close().ok());
  ASSERT_TRUE(env->RenameFile(dir + "/a/b/tmp", dir + "/a/b/final").ok());
  ASSERT_TRUE(env->SyncDir(dir + "/a/b").ok());
  std::ifstream in(dir + "/a/b/final");
  std::string text;
  in >> text;
  EXPECT_EQ(text, "hello");
  ASSERT_TRUE(env->RemoveFile(dir + "/a/b/final").ok());
  EXPECT_TRUE(env->RemoveFile(dir + "/a/b/final").ok());  // already gone is fine
  EXPECT_FALSE(env->RenameFile(dir + "/nope", dir + "/x").ok());

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
  std::unique_ptr<WritableFile> f;
  Status s = env->NewWritableFile(dir + "/d", /*direct=*/true, &f);
  if (s.code() == Status::Code::kUnimplemented) GTEST_SKIP() << s.message();
  ASSERT_TRUE(s.ok()) << s.ToString();
  void* block = aligned_alloc(4096, 8192);
  std::memset(block, 'q', 8192);
  ASSERT_TRUE(f->Append(static_cast<const char*>(block), 8192).ok());
  ASSERT_TRUE(f->Truncate(5000).ok());
  ASSERT_TRUE(f->Sync().ok());
  ASSERT_TRUE(f->Close().ok());
  free(block);
  EXPECT_EQ(fs::file_size(dir + "/d"), 5000u);
  fs::remove_all(dir);
}

}  // namespace tce
