// The table of storage backends: each scheme reaches its own backend, a
// location is checked by that backend before anything opens, and an unknown
// scheme is refused naming the known ones.
#include "storage/backends.h"

#include <gtest/gtest.h>

#include <set>

namespace tce {
namespace {

TEST(StorageBackends, EachSchemeReachesItsOwnBackendOnce) {
  std::set<std::string> schemes;
  for (const StorageBackend& b : StorageBackends()) {
    EXPECT_TRUE(schemes.insert(b.scheme).second) << b.scheme << " is in the table twice";
    std::string location;
    Status s;
    EXPECT_EQ(BackendOf(std::string(b.scheme) + "://somewhere/x", &location, &s), &b);
    EXPECT_TRUE(s.ok()) << s.ToString();
    EXPECT_EQ(location, "somewhere/x");
  }
  EXPECT_EQ(schemes, (std::set<std::string>{"file", "s3"}));
}

TEST(StorageBackends, TheFileBackendOpensADirectoryAndRefusesARelativeOne) {
  StorageOptions o;
  o.file.env = Env::Default();
  std::shared_ptr<ObjectStore> store;
  std::string prefix = "unset";
  Status s = OpenObjectStore("file:///srv/ckpt/", o, &store, &prefix);
  ASSERT_TRUE(s.ok()) << s.ToString();
  EXPECT_EQ(prefix, "");
  EXPECT_EQ(store->Url("a/x.pt"), "/srv/ckpt/a/x.pt");
  s = OpenObjectStore("file://srv/ckpt", o, &store, &prefix);
  EXPECT_EQ(s.code(), Status::Code::kInvalidArgument);
  EXPECT_EQ(s.message(), "'file://srv/ckpt': not a directory root (want file:///ABSOLUTE/DIR)");
}

TEST(StorageBackends, ObjectRootsAreCheckedByTheirBackendWhenTheSettingIsRead) {
  std::vector<std::string> dirs;
  std::vector<std::pair<std::string, std::string>> objects;
  Status s = ParseStorageRoots("/a/, /b=s3://bucket/run1", &dirs, &objects);
  ASSERT_TRUE(s.ok()) << s.ToString();
  EXPECT_EQ(dirs, std::vector<std::string>{"/a"});
  ASSERT_EQ(objects.size(), 1u);
  EXPECT_EQ(objects[0], (std::pair<std::string, std::string>{"/b", "s3://bucket/run1"}));

  s = ParseStorageRoots("/b=s3://Bucket_1/run1", &dirs, &objects);
  EXPECT_EQ(s.message(), "'s3://Bucket_1/run1': 'Bucket_1' is not a bucket name (3-63 of a-z, 0-9, '.', '-')");
  s = ParseStorageRoots("/b=s3://bucket/a/../x", &dirs, &objects);
  EXPECT_EQ(s.message(), "'s3://bucket/a/../x': the key prefix has an empty, '.' or '..' component");
  s = ParseStorageRoots("/b=gcs://bucket", &dirs, &objects);
  EXPECT_EQ(s.message(), "storage root /b: unknown scheme 'gcs' (want s3://)");
  s = ParseStorageRoots("/b=file:///c", &dirs, &objects);  // a directory root is written as DIR alone
  EXPECT_EQ(s.message(), "storage root /b: unknown scheme 'file' (want s3://)");
  s = ParseStorageRoots("/b=bucket", &dirs, &objects);
  EXPECT_EQ(s.message(), "'bucket' is not a URL (want SCHEME://LOCATION, e.g. s3://BUCKET[/PREFIX])");
}

}  // namespace
}  // namespace tce
