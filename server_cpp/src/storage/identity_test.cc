#include "storage/identity.h"

#include <gtest/gtest.h>

namespace tce {
namespace {

DiskIdentity Written(uint64_t ino, uint64_t size, int64_t mtime_ns) {
  DiskIdentity d;
  d.known = d.exists = d.written = true;
  d.dev = 7;
  d.ino = ino;
  d.size = size;
  d.mtime_ns = mtime_ns;
  return d;
}

TEST(SameStoredFileTest, TheSameInodeSizeAndTimeIsTheSameFile) {
  const DiskIdentity was = Written(10, 100, 5);
  EXPECT_TRUE(SameStoredFile(was, Written(10, 100, 5)));
  EXPECT_FALSE(SameStoredFile(was, Written(11, 100, 5)));  // replaced (rename over it)
  EXPECT_FALSE(SameStoredFile(was, Written(10, 101, 5)));  // grown in place
  EXPECT_FALSE(SameStoredFile(was, Written(10, 100, 6)));  // rewritten in place
  DiskIdentity elsewhere = Written(10, 100, 5);
  elsewhere.dev = 8;
  EXPECT_FALSE(SameStoredFile(was, elsewhere));
  DiskIdentity from_peer = was;  // a peer's identity knows no device of this node
  from_peer.dev = 0;
  EXPECT_TRUE(SameStoredFile(from_peer, Written(10, 100, 5)));
}

TEST(SameStoredFileTest, OnlyAFileKnownWrittenThereCanBeTheSame) {
  DiskIdentity before = Written(10, 100, 5);
  before.written = false;  // what was there before a save
  EXPECT_FALSE(SameStoredFile(before, Written(10, 100, 5)));
  EXPECT_FALSE(SameStoredFile(DiskIdentity(), Written(10, 100, 5)));
}

TEST(SameStoredFileTest, ObjectsAreTheSameByETagAndSize) {
  ObjectId o;
  o.exists = true;
  o.size = 100;
  o.etag = "\"abc\"";
  DiskIdentity was = IdentityOf(o);
  was.written = true;
  EXPECT_TRUE(SameStoredFile(was, IdentityOf(o)));
  o.etag = "\"abd\"";
  EXPECT_FALSE(SameStoredFile(was, IdentityOf(o)));
}

}  // namespace
}  // namespace tce
