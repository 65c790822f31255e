// StorageRoots: one answer to "which store holds this path" for both kinds
// of root, directory roots resolved beneath the root and object roots by
// prefix, the object root winning over a directory root above it.
#include "storage/storage_roots.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "common/testing.h"

namespace tce {
namespace {
namespace fs = std::filesystem;

class StorageRootsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    top_ = MakeTempDir("tce-roots");
    fs::create_directories(top_ + "/ckpt/run1/step1");
    fs::create_directories(top_ + "/outside");
    fs::create_directories(top_ + "/bucket");
    fs::create_directory_symlink(top_ + "/outside", top_ + "/ckpt/escape");
    fs::create_directory_symlink(top_ + "/ckpt/run1", top_ + "/alias");
    PosixStoreOptions file;
    file.env = Env::Default();
    // An object root below the directory root, its store a directory (any
    // ObjectStore does), keys prefixed "p/".
    auto objects = std::make_shared<ObjectRoots>();
    objects->Add({top_ + "/ckpt/obj", "file://" + top_ + "/bucket", "p/",
                  std::make_shared<PosixStore>(top_ + "/bucket", file)});
    object_store_ = objects->all()[0].store.get();
    roots_ = std::make_unique<StorageRoots>(std::vector<std::string>{top_ + "/ckpt/"}, objects, file);
  }
  void TearDown() override { fs::remove_all(top_); }

  std::string top_;
  ObjectStore* object_store_ = nullptr;
  std::unique_ptr<StorageRoots> roots_;
};

TEST_F(StorageRootsTest, APathUnderADirectoryRootIsItsPosixStoresKeyAsResolvedNow) {
  StorageRoots::Location at;
  ASSERT_TRUE(roots_->Locate(top_ + "/ckpt/run1/step1/x.pt", &at).ok());
  EXPECT_EQ(at.key, "run1/step1/x.pt");
  EXPECT_EQ(at.root, top_ + "/ckpt");
  EXPECT_EQ(at.object, nullptr);
  EXPECT_EQ(at.store->Url(at.key), top_ + "/ckpt/run1/step1/x.pt");
  // Reached through a symlink outside the root: the resolved directory's key.
  ASSERT_TRUE(roots_->Locate(top_ + "/alias/step1/y.pt", &at).ok());
  EXPECT_EQ(at.key, "run1/step1/y.pt");
  ASSERT_TRUE(roots_->Locate(top_ + "/ckpt/z.pt", &at).ok());
  EXPECT_EQ(at.key, "z.pt");
}

TEST_F(StorageRootsTest, AnObjectRootWinsOverTheDirectoryRootAboveIt) {
  StorageRoots::Location at;
  ASSERT_TRUE(roots_->Locate(top_ + "/ckpt/obj/a/x.pt", &at).ok());
  EXPECT_EQ(at.store, object_store_);
  EXPECT_EQ(at.key, "p/a/x.pt");
  ASSERT_NE(at.object, nullptr);
  EXPECT_EQ(at.object->dir, top_ + "/ckpt/obj");
  std::string key;
  EXPECT_EQ(roots_->ObjectRootOf(top_ + "/ckpt/obj/a/x.pt", &key), at.object);
  EXPECT_EQ(key, "p/a/x.pt");
  EXPECT_EQ(roots_->ObjectRootOf(top_ + "/ckpt/objx/a.pt", nullptr), nullptr);  // a prefix is whole components
}

TEST_F(StorageRootsTest, APathResolvingOutsideEveryRootIsRefused) {
  StorageRoots::Location at;
  Status s = roots_->Locate(top_ + "/ckpt/escape/x.pt", &at);
  EXPECT_EQ(s.code(), Status::Code::kPermissionDenied);
  EXPECT_EQ(s.message(), top_ + "/ckpt/escape resolves to " + top_ + "/outside, which is not under a storage root");
  EXPECT_EQ(roots_->Locate(top_ + "/outside/x.pt", &at).code(), Status::Code::kPermissionDenied);
  s = roots_->CheckUnder(top_ + "/outside/x.pt");
  EXPECT_EQ(s.code(), Status::Code::kPermissionDenied);
  EXPECT_EQ(s.message(), top_ + "/outside/x.pt is not under a storage root (" + top_ + "/ckpt, " + top_ +
                             "/ckpt/obj=file://" + top_ + "/bucket)");
  EXPECT_TRUE(roots_->CheckUnder(top_ + "/alias/step1/y.pt").ok());
  EXPECT_TRUE(roots_->CheckUnder(top_ + "/ckpt/obj/anything").ok());
}

TEST_F(StorageRootsTest, DirectoriesOpenThroughTheStoreAndNeverBeyondTheRoot) {
  { std::ofstream(top_ + "/ckpt/run1/step1/x.pt") << "x"; }
  std::unique_ptr<Directory> d;
  std::string resolved;
  ASSERT_TRUE(roots_->OpenDirectory(top_ + "/alias/step1", &d, &resolved).ok());
  EXPECT_EQ(resolved, top_ + "/ckpt/run1/step1");
  std::vector<std::pair<std::string, FileStat>> entries;
  ASSERT_TRUE(d->List(&entries).ok());
  ASSERT_EQ(entries.size(), 1u);
  EXPECT_EQ(entries[0].first, "x.pt");
  ASSERT_TRUE(roots_->OpenDirectory(top_ + "/ckpt", &d).ok());  // the root itself
  EXPECT_EQ(roots_->OpenDirectory(top_ + "/ckpt/escape", &d).code(), Status::Code::kPermissionDenied);
  EXPECT_EQ(roots_->OpenDirectory(top_ + "/ckpt/run1/none", &d).code(), Status::Code::kNotFound);
}

TEST_F(StorageRootsTest, NoRootIsMemoryOnlyAndTakesAnyPath) {
  const StorageRoots none;
  EXPECT_TRUE(none.empty());
  EXPECT_EQ(none.Describe(), "");
  EXPECT_TRUE(none.CheckUnder("/anywhere/x.pt").ok());
  StorageRoots::Location at;
  EXPECT_EQ(none.Locate("/anywhere/x.pt", &at).code(), Status::Code::kPermissionDenied);
  EXPECT_FALSE(roots_->empty());
  EXPECT_EQ(roots_->dirs(), std::vector<std::string>{top_ + "/ckpt"});
}

TEST_F(StorageRootsTest, OpenRefusesAMissingDirectoryRootAndReadsBothKinds) {
  StorageOptions o;
  o.file.env = Env::Default();
  std::shared_ptr<StorageRoots> roots;
  Status s = StorageRoots::Open(top_ + "/missing", o, &roots);
  EXPECT_EQ(s.code(), Status::Code::kNotFound);
  EXPECT_EQ(s.message(), top_ + "/missing does not exist: the server never creates a storage root "
                                "(mount or create it first, or leave it out)");
  ASSERT_TRUE(StorageRoots::Open(top_ + "/ckpt, " + top_ + "/outside", o, &roots).ok());
  EXPECT_EQ(roots->dirs(), (std::vector<std::string>{top_ + "/ckpt", top_ + "/outside"}));
  // A root that is a symlink to a directory (a mount point's alias) is that directory.
  Status linked = StorageRoots::Open(top_ + "/alias", o, &roots);
  ASSERT_TRUE(linked.ok()) << linked.ToString();
  EXPECT_EQ(roots->dirs(), std::vector<std::string>{top_ + "/ckpt/run1"});
  fs::create_symlink(top_ + "/missing", top_ + "/dangling");
  EXPECT_EQ(StorageRoots::Open(top_ + "/dangling", o, &roots).code(), Status::Code::kNotFound);
  EXPECT_TRUE(roots->objects().empty());
  EXPECT_EQ(StorageRoots::Open("relative", o, &roots).code(), Status::Code::kInvalidArgument);
}

TEST_F(StorageRootsTest, RootNameGroupsAPathByTheRootItIsWrittenUnder) {
  EXPECT_EQ(roots_->RootName(top_ + "/ckpt/run1/x.pt"), top_ + "/ckpt");
  EXPECT_EQ(roots_->RootName(top_ + "/ckpt/obj/run1/x.pt"), top_ + "/ckpt/obj");  // the object root below it
  EXPECT_EQ(roots_->RootName(top_ + "/outside/x.pt"), "");
  EXPECT_EQ(roots_->RootName(top_ + "/ckptx/x.pt"), "");  // a name that merely begins like the root
  // A root configured as a symlink: paths written through it, or through
  // the directory it names, are its (named as resolved, as dirs() names it).
  StorageOptions o;
  o.file.env = Env::Default();
  std::shared_ptr<StorageRoots> linked;
  ASSERT_TRUE(StorageRoots::Open(top_ + "/alias", o, &linked).ok());
  EXPECT_EQ(linked->RootName(top_ + "/alias/step1/x.pt"), top_ + "/ckpt/run1");
  EXPECT_EQ(linked->RootName(top_ + "/ckpt/run1/step1/x.pt"), top_ + "/ckpt/run1");
  EXPECT_EQ(StorageRoots().RootName("/any/x.pt"), "");
}

}  // namespace
}  // namespace tce
