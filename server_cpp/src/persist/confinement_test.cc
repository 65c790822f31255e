// Storage confinement: a save is written only under a storage root, however
// the tree changes after Allocate; temp names are unguessable and follow no
// symlink, and a restart removes only its own. See persist/persister.h.
#include <gtest/gtest.h>

#include <fstream>
#include <string>
#include <vector>

#include "env/env.h"
#include "persist/persister.h"
#include "persist/persister_fixture.h"

namespace tce {
namespace {

// Storage confinement: the check at Allocate is not the last word.
class ConfinementTest : public PersisterTest {
 protected:
  void SetUp() override {
    PersisterTest::SetUp();
    outside_ = MakeTempDir("tce-outside");
  }
  void TearDown() override {
    PersisterTest::TearDown();
    fs::remove_all(outside_);
  }
  std::string outside_;
};

TEST_F(ConfinementTest, ADirectorySwappedForASymlinkAfterAllocateIsNotWrittenThrough) {
  Start(/*retries=*/0, /*direct_io=*/true, /*run=*/false);
  fs::create_directories(root_ + "/swap");
  const std::string path = root_ + "/swap/x.pt";
  Save(path, 's');  // accepted: swap/ is a directory under the root now
  fs::remove_all(root_ + "/swap");
  fs::create_directory_symlink(outside_, root_ + "/swap");
  persister_->Start();
  std::vector<FileInfo> out;
  ASSERT_TRUE(Wait(path, &out).ok());
  // The directory the save found is gone: the save is dropped, and nothing
  // goes through the symlink.
  EXPECT_EQ(out[0].state, FileState::kDiscarded);
  EXPECT_NE(out[0].reason.find("not under a storage root"), std::string::npos) << out[0].reason;
  EXPECT_TRUE(fs::is_empty(outside_));
}

TEST_F(ConfinementTest, AParentSymlinkWhoseTargetAppearsLaterIsNotWrittenThrough) {
  Start(/*retries=*/0, /*direct_io=*/true, /*run=*/false);
  fs::create_directory_symlink(outside_ + "/later", root_ + "/dangling");
  const std::string path = root_ + "/dangling/x.pt";
  // The target does not exist, so the path resolves under the root; the
  // save is refused at once, as the walk meets the symlink.
  AllocateResult a;
  Status s = cache_->Allocate({session_, "job", "t", path, 0, FakeZip::kSize}, &a);
  EXPECT_EQ(s.code(), Status::Code::kPermissionDenied) << s.ToString();
  EXPECT_NE(s.message().find("is a symlink or not a directory"), std::string::npos) << s.ToString();
  EXPECT_TRUE(fs::is_empty(outside_));  // not even the target directory was made
}

TEST_F(ConfinementTest, TempNamesAreUnguessableAndFollowNoSymlink) {
  Start();
  // Symlinks at every temp name the old scheme would have used.
  { std::ofstream(outside_ + "/victim") << "root's file"; }
  for (int v = 0; v < 64; ++v)
    fs::create_symlink(outside_ + "/victim", root_ + "/.t.pt.tce-tmp-" + std::to_string(v));
  const std::string path = root_ + "/t.pt";
  Save(path, 'v');
  std::vector<FileInfo> out;
  ASSERT_TRUE(Wait(path, &out).ok());
  EXPECT_EQ(out[0].state, FileState::kPersisted) << out[0].reason;
  EXPECT_EQ(Read(outside_ + "/victim"), "root's file");
  EXPECT_EQ(Read(path)[FakeZip::kData], 'v');
}

TEST_F(ConfinementTest, ALongFileNameStillPersists) {
  Start();
  const std::string path = root_ + "/" + std::string(250, 'n') + ".pt";  // 253 bytes: a valid name
  Save(path, 'n');
  std::vector<FileInfo> out;
  ASSERT_TRUE(Wait(path, &out).ok());
  EXPECT_EQ(out[0].state, FileState::kPersisted) << out[0].reason;
}

TEST_F(ConfinementTest, RestartRemovesOnlyItsOwnTempFiles) {
  fs::create_directories(root_ + "/d");
  const std::string mine = root_ + "/d/.tce-0000abcd.0123456789abcdef";
  const std::string theirs = root_ + "/d/.tce-ffff0000.0123456789abcdef";
  const std::string user = root_ + "/d/.tce-0000abcd.notours";
  for (const std::string& p : {mine, theirs, user}) std::ofstream(p) << "x";
  fs::create_directories(outside_ + "/d");
  const std::string beyond = outside_ + "/d/.tce-0000abcd.0123456789abcdef";
  { std::ofstream(beyond) << "x"; }
  fs::create_directory_symlink(outside_ + "/d", root_ + "/link");
  const StorageRoots roots({root_}, nullptr, PosixStoreOptions());
  const int removed = Persister::RemoveStaleTemps(
      roots, {root_ + "/d/x.pt", root_ + "/d/y.pt", root_ + "/link/z.pt"}, ".tce-0000abcd.");
  EXPECT_EQ(removed, 1);
  EXPECT_FALSE(fs::exists(mine));
  EXPECT_TRUE(fs::exists(theirs));  // another server's, in a shared directory
  EXPECT_TRUE(fs::exists(user));
  EXPECT_TRUE(fs::exists(beyond));  // beyond a symlink out of the root
}

}  // namespace
}  // namespace tce
