// Published versions: numbering, the wait for a newer one, version leases,
// read grants (cache/cache_versions.cc, tag_registry, read_grants).
#include <gtest/gtest.h>
#include <unistd.h>

#include <thread>

#include "cache/cache.h"
#include "cache/tag_registry.h"
#include "cache/versions_fixture.h"
#include "common/manual_clock.h"

namespace tce {
namespace {
using namespace versions_testing;

TEST(TagRegistry, NumbersVersionsPerJobInPublicationOrder) {
  TagRegistry r;
  EXPECT_EQ(r.Complete(Tag("j", "a", {{0, "/c/a", 1}}), 10).version, 1u);
  EXPECT_EQ(r.Complete(Tag("j", "b", {{0, "/c/b", 1}}), 20).version, 2u);
  EXPECT_EQ(r.Complete(Tag("k", "a", {{0, "/d/a", 1}}), 30).version, 1u);  // per job
  EXPECT_EQ(r.Complete(Tag("j", "a", {{0, "/c/a", 2}}), 40).version, 3u);  // again: the next
  TagInfo t;
  ASSERT_TRUE(r.Newest("j", 0, &t));
  EXPECT_EQ(t.tag, "a");
  EXPECT_EQ(t.version, 3u);
  EXPECT_FALSE(r.Newest("j", 3, &t));
  ASSERT_TRUE(r.FindVersion("j", 2, &t));
  EXPECT_EQ(t.tag, "b");
  EXPECT_FALSE(r.FindVersion("j", 1, &t));  // re-recorded: version 1 is gone
}

TEST(TagRegistry, KeepsVersionsAcrossARestartAndNumbersOldRowsAfter) {
  TagRegistry r;
  TagInfo a = Tag("j", "a", {{0, "/c/a", 1}}), b = Tag("j", "b", {{0, "/c/b", 1}});
  TagInfo old = Tag("j", "old", {{0, "/c/o", 1}});  // written before versions existed
  a.complete_unix_ns = 10, a.version = 4;
  b.complete_unix_ns = 20, b.version = 7;
  old.complete_unix_ns = 5;
  r.Restore({b, old, a});
  TagInfo t;
  ASSERT_TRUE(r.Newest("j", 0, &t));
  EXPECT_EQ(t.tag, "old");
  EXPECT_EQ(t.version, 8u);
  EXPECT_EQ(r.Complete(Tag("j", "c", {{0, "/c/c", 1}}), 30).version, 9u);
  // A tag from the ring keeps its number unless this job used it already.
  TagInfo ring = Tag("j", "d", {{0, "/c/d", 1}});
  ring.complete_unix_ns = 40, ring.version = 7;
  ASSERT_TRUE(r.Adopt(ring));
  ASSERT_TRUE(r.Newest("j", 9, &t));
  EXPECT_EQ(t.version, 10u);
  ring = Tag("j", "e", {{0, "/c/e", 1}});
  ring.complete_unix_ns = 50, ring.version = 12;
  ASSERT_TRUE(r.Adopt(ring));
  ASSERT_TRUE(r.FindVersion("j", 12, &t));
  EXPECT_EQ(t.tag, "e");
}

TEST(TagRegistry, EachJobsNumberingHasAnEpochThatARestartKeepsAndLostStateDoesNot) {
  TagRegistry r;
  const TagInfo a = r.Complete(Tag("j", "a", {{0, "/c/a", 1}}), 10);
  const TagInfo b = r.Complete(Tag("j", "b", {{0, "/c/b", 1}}), 20);
  const TagInfo k = r.Complete(Tag("k", "a", {{0, "/d/a", 1}}), 30);
  EXPECT_NE(a.epoch, 0u);
  EXPECT_EQ(b.epoch, a.epoch);
  EXPECT_NE(k.epoch, a.epoch);
  TagRegistry restarted;  // from metadata: the same numbering
  restarted.Restore({a, b});
  EXPECT_EQ(restarted.Complete(Tag("j", "c", {{0, "/c/c", 1}}), 40).epoch, a.epoch);
  TagRegistry lost;  // a server that lost its state numbers from 1 again, in another epoch
  const TagInfo again = lost.Complete(Tag("j", "a", {{0, "/c/a", 1}}), 50);
  EXPECT_EQ(again.version, 1u);
  EXPECT_NE(again.epoch, a.epoch);
  TagInfo old = Tag("j", "x", {{0, "/c/x", 1}}), older = Tag("j", "y", {{0, "/c/y", 1}});
  old.complete_unix_ns = 1, old.version = 1, older.complete_unix_ns = 2, older.version = 2;
  TagRegistry from_rows;  // rows of a server that kept no epoch: one for the job
  from_rows.Restore({old, older});
  TagInfo t1, t2;
  ASSERT_TRUE(from_rows.FindVersion("j", 1, &t1) && from_rows.FindVersion("j", 2, &t2));
  EXPECT_NE(t1.epoch, 0u);
  EXPECT_EQ(t1.epoch, t2.epoch);
}


TEST_F(VersionsTest, NewestVersionAndNotFoundWithoutWaiting) {
  TagInfo t;
  Status s = cache_.publication()->GetVersion(owner_, "job", 0, std::chrono::milliseconds(0), kNoDeadline, &t);
  EXPECT_EQ(s.code(), Status::Code::kNotFound);
  EXPECT_EQ(s.message(), "job 'job' has no version published");
  Save("s1", "/c/s1.pt", 100);
  Publish("s1", {{0, "/c/s1.pt", 100}});
  ASSERT_TRUE(cache_.publication()->GetVersion(owner_, "job", 0, std::chrono::milliseconds(0), kNoDeadline, &t).ok());
  EXPECT_EQ(t.version, 1u);
  EXPECT_EQ(t.tag, "s1");
  s = cache_.publication()->GetVersion(owner_, "job", 1, std::chrono::milliseconds(0), kNoDeadline, &t);
  EXPECT_EQ(s.message(), "job 'job' has no version newer than 1");
}

TEST_F(VersionsTest, AWaitingReaderIsAnsweredWhenTheVersionIsPublished) {
  Save("s1", "/c/s1.pt", 100);
  Publish("s1", {{0, "/c/s1.pt", 100}});
  const uint64_t before = clock_.waits();
  TagInfo got;
  Status result;
  std::thread reader([&] {
    result = cache_.publication()->GetVersion(owner_, "job", 1, std::chrono::seconds(30), kNoDeadline, &got);
  });
  while (clock_.waits() == before) std::this_thread::yield();  // it waits now
  Save("s2", "/c/s2.pt", 100);
  Publish("s2", {{0, "/c/s2.pt", 100}});
  reader.join();  // answered with no time passing on the clock
  ASSERT_TRUE(result.ok()) << result.ToString();
  EXPECT_EQ(got.version, 2u);
  EXPECT_EQ(got.tag, "s2");
}

TEST_F(VersionsTest, AWaitEndsAtItsTimeoutAndNotBefore) {
  const uint64_t before = clock_.waits();
  TagInfo got;
  Status result;
  std::thread reader([&] {
    result = cache_.publication()->GetVersion(owner_, "job", 0, std::chrono::seconds(5), kNoDeadline, &got);
  });
  while (clock_.waits() == before) std::this_thread::yield();
  clock_.Advance(std::chrono::milliseconds(4999));
  clock_.Advance(std::chrono::milliseconds(1));
  reader.join();
  EXPECT_EQ(result.code(), Status::Code::kDeadlineExceeded);
  EXPECT_EQ(result.message(), "no version of job 'job' published within 5.0 s");
}

TEST_F(VersionsTest, ALeaseKeepsTheVersionsBytesWhenThePathIsSavedAgain) {
  const uint64_t first = Save("s1", "/c/model.pt", 4096);
  Publish("s1", {{0, "/c/model.pt", 4096}});
  std::string reader = cache_.sessions()->OpenSession(kOwner, 2, kOwner);
  VersionGrant g;
  ASSERT_TRUE(cache_.publication()->AcquireVersion(reader, "job", 0, std::chrono::milliseconds(0), &g).ok());
  EXPECT_EQ(g.tag.version, 1u);
  EXPECT_EQ(g.lease, std::chrono::seconds(60));  // the default
  ASSERT_EQ(g.files.size(), 1u);
  EXPECT_EQ(g.files[0].buffer_id, first);
  EXPECT_EQ(cache_.Stats().version_leases, 1u);

  const uint64_t second = Save("s2", "/c/model.pt", 4096);  // the same path, while leased
  EXPECT_NE(second, first);  // the leased buffer was not reused
  int fd = -1;
  bool writable = true;
  uint64_t cap = 0;
  ASSERT_TRUE(cache_.sessions()->FdFor(reader, first, &fd, &writable, &cap).ok());  // still readable
  EXPECT_FALSE(writable);
  close(fd);
  // Version 1 is gone for a new reader: its file was saved again.
  VersionGrant again;
  Status s = cache_.publication()->AcquireVersion(owner_, "job", 1, std::chrono::milliseconds(0), &again);
  EXPECT_EQ(s.code(), Status::Code::kFailedPrecondition);
  EXPECT_EQ(s.message(),
            "version 1 of job 'job' is gone: /c/model.pt was saved again after it was published "
            "(read a newer version)");
  ASSERT_TRUE(cache_.publication()->ReleaseVersion(reader, g.lease_id).ok());
  EXPECT_EQ(cache_.publication()->ReleaseVersion(reader, g.lease_id).code(), Status::Code::kNotFound);
  EXPECT_EQ(cache_.Stats().version_leases, 0u);
  EXPECT_EQ(cache_.Stats().leases, 0u);
}

TEST_F(VersionsTest, AnUnrenewedLeaseEndsAtItsTimeAndItsBuffersAreNotReused) {
  const uint64_t first = Save("s1", "/c/model.pt", 4096);
  Publish("s1", {{0, "/c/model.pt", 4096}});
  std::string reader = cache_.sessions()->OpenSession(kOwner, 2, kOwner);
  VersionGrant g;
  ASSERT_TRUE(cache_.publication()->AcquireVersion(reader, "job", 1, std::chrono::seconds(1000), &g).ok());
  EXPECT_EQ(g.lease, std::chrono::seconds(120));  // cut to the maximum
  clock_.Advance(std::chrono::seconds(100));
  std::chrono::milliseconds granted{0};
  ASSERT_TRUE(cache_.publication()->RenewVersion(reader, g.lease_id, std::chrono::seconds(10), &granted).ok());
  EXPECT_EQ(granted, std::chrono::seconds(10));
  clock_.Advance(std::chrono::milliseconds(9999));
  EXPECT_EQ(cache_.publication()->ExpireVersionLeases(), 0u);
  clock_.Advance(std::chrono::milliseconds(1));
  EXPECT_EQ(cache_.publication()->ExpireVersionLeases(), 1u);
  EXPECT_EQ(cache_.Stats().leases, 0u);
  EXPECT_EQ(cache_.publication()->RenewVersion(reader, g.lease_id, std::chrono::seconds(10), &granted).code(),
            Status::Code::kNotFound);
  // The reader may still map the old bytes: that buffer is destroyed, not reused.
  const uint64_t buffers = cache_.Stats().buffers;
  const uint64_t second = Save("s2", "/c/model.pt", 4096);
  EXPECT_NE(second, first);
  EXPECT_EQ(cache_.Stats().buffers, buffers);  // one made, the old one destroyed
  EXPECT_EQ(cache_.Stats().buffers_reused, 0u);
}

TEST_F(VersionsTest, AReaderKeepingAMappingNeitherStopsReuseNorMissesTheBuffersEnd) {
  const uint64_t first = Save("s1", "/c/a.pt", 4096);
  Publish("s1", {{0, "/c/a.pt", 4096}});
  std::string reader = cache_.sessions()->OpenSession(kOwner, 2, kOwner);
  VersionGrant g;
  ASSERT_TRUE(cache_.publication()->AcquireVersion(reader, "job", 0, std::chrono::milliseconds(0), &g).ok());
  int fd = -1;
  bool writable = true;
  uint64_t cap = 0;
  ASSERT_TRUE(cache_.sessions()->FdFor(reader, first, &fd, &writable, &cap, /*keep_mapped=*/true).ok());
  close(fd);
  ASSERT_TRUE(cache_.publication()->ReleaseVersion(reader, g.lease_id).ok());
  // Saved again: the file's old buffer is free and the reader still maps
  // it; the next save of the owner reuses it all the same.
  const uint64_t second = Save("s2", "/c/a.pt", 4096);
  Publish("s2", {{0, "/c/a.pt", 4096}});
  EXPECT_NE(second, first);
  EXPECT_EQ(Save("s3", "/c/b.pt", 4096), first);
  EXPECT_EQ(cache_.Stats().buffers_reused, 1u);
  // The buffer goes (its file removed, the room taken): the reader is told.
  FileInfo gone;
  ASSERT_TRUE(cache_.Remove(owner_, "job", "/c/b.pt", &gone).ok());
  AllocateResult a;
  ASSERT_TRUE(cache_.Allocate({owner_, "job", "f", "/c/fill.pt", 0, 60 << 10}, &a).ok());
  // 64 MiB - 64 KiB of capacity: it fits only once the free 4 KiB buffer goes.
  Status s = cache_.Allocate({owner_, "job", "big", "/c/big.pt", 0, 64448ull << 10}, &a);
  ASSERT_TRUE(s.ok()) << s.ToString();
  EXPECT_EQ(a.capacity, (64ull << 20) - (64 << 10));
  ASSERT_TRUE(cache_.publication()->AcquireVersion(reader, "job", 0, std::chrono::milliseconds(0), &g).ok());
  EXPECT_EQ(g.unmap_buffer_ids, std::vector<uint64_t>{first});
}

TEST_F(VersionsTest, ASessionsEndEndsItsVersionLeases) {
  Save("s1", "/c/model.pt", 4096);
  Publish("s1", {{0, "/c/model.pt", 4096}});
  std::string reader = cache_.sessions()->OpenSession(kOwner, 2, kOwner);
  VersionGrant g;
  ASSERT_TRUE(cache_.publication()->AcquireVersion(reader, "job", 0, std::chrono::milliseconds(0), &g).ok());
  cache_.sessions()->CloseSession(reader);
  EXPECT_EQ(cache_.Stats().version_leases, 0u);
  EXPECT_EQ(cache_.Stats().leases, 0u);
}

TEST_F(VersionsTest, OtherUsersReadOnlyWithAGrantAndOnlyPublishedVersions) {
  const uint64_t buf = Save("s1", "/c/model.pt", 4096);
  Publish("s1", {{0, "/c/model.pt", 4096}});
  std::string reader = cache_.sessions()->OpenSession(kReader, 3, kStranger);
  std::string stranger = cache_.sessions()->OpenSession(kStranger, 4, kStranger);
  TagInfo t;
  VersionGrant g;
  Status s = cache_.publication()->AcquireVersion(reader, "job", 0, std::chrono::milliseconds(0), &g);
  EXPECT_EQ(s.code(), Status::Code::kPermissionDenied);
  EXPECT_EQ(s.message(), "uid 1001 may not read the published versions of job 'job' (it belongs to uid 1000): "
                         "no read grant for uid 1001 or gid 1002");
  // Only the owner grants.
  ReadGrants::Ids ids{{kReader}, {}, {}};
  EXPECT_EQ(cache_.publication()->GrantRead(stranger, "job", &ids, false).code(), Status::Code::kPermissionDenied);
  ids = {{kReader}, {}, {}};
  ASSERT_TRUE(cache_.publication()->GrantRead(owner_, "job", &ids, false).ok());
  EXPECT_EQ(ids.uids, std::set<uid_t>{kReader});
  ASSERT_TRUE(cache_.publication()->GetVersion(reader, "job", 0, std::chrono::milliseconds(0), kNoDeadline, &t).ok());
  ASSERT_TRUE(cache_.publication()->AcquireVersion(reader, "job", 0, std::chrono::milliseconds(0), &g).ok());
  int fd = -1;
  bool writable = true;
  uint64_t cap = 0;
  ASSERT_TRUE(cache_.sessions()->FdFor(reader, buf, &fd, &writable, &cap).ok());
  EXPECT_FALSE(writable);
  close(fd);
  // A grant reads versions, nothing else.
  FileInfo f;
  uint64_t lease = 0;
  std::vector<uint64_t> unmap;
  EXPECT_EQ(cache_.Lookup(reader, "job", "/c/model.pt", true, &f, &lease, &unmap).code(),
            Status::Code::kPermissionDenied);
  std::vector<TagInfo> tags;
  EXPECT_EQ(cache_.ListTags(reader, "job", &tags).code(), Status::Code::kPermissionDenied);
  AllocateRequest r{reader, "job", "x", "/c/x.pt", 0, 10};
  AllocateResult a;
  EXPECT_EQ(cache_.Allocate(r, &a).code(), Status::Code::kPermissionDenied);
  EXPECT_EQ(cache_.publication()->GetVersion(stranger, "job", 0, std::chrono::milliseconds(0), kNoDeadline, &t).code(),
            Status::Code::kPermissionDenied);
  // Revoked: the next read is refused, saying so.
  ASSERT_TRUE(cache_.publication()->ReleaseVersion(reader, g.lease_id).ok());
  ids = {{kReader}, {}, {}};
  ASSERT_TRUE(cache_.publication()->GrantRead(owner_, "job", &ids, true).ok());
  EXPECT_TRUE(ids.uids.empty());
  s = cache_.publication()->AcquireVersion(reader, "job", 0, std::chrono::milliseconds(0), &g);
  EXPECT_EQ(s.message(), "uid 1001 may not read the published versions of job 'job' (it belongs to uid 1000): "
                         "the owner revoked the read grant of uid 1001");
  // A buffer another uid held an fd of is never reused: replaced, it goes.
  const uint64_t buffers = cache_.Stats().buffers;
  Save("s2", "/c/model.pt", 4096);
  EXPECT_EQ(cache_.Stats().buffers, buffers);
  EXPECT_EQ(cache_.Stats().buffers_reused, 0u);
}

TEST_F(VersionsTest, AGroupGrantLetsItsMembersIn) {
  Save("s1", "/c/model.pt", 4096);
  Publish("s1", {{0, "/c/model.pt", 4096}});
  std::string reader = cache_.sessions()->OpenSession(kReader, 3, kReaders);
  ReadGrants::Ids ids{{}, {kReaders}, {}};
  ASSERT_TRUE(cache_.publication()->GrantRead(owner_, "job", &ids, false).ok());
  TagInfo t;
  EXPECT_TRUE(cache_.publication()->GetVersion(reader, "job", 0, std::chrono::milliseconds(0), kNoDeadline, &t).ok());
  std::string other = cache_.sessions()->OpenSession(kStranger, 4, kStranger);
  EXPECT_FALSE(cache_.publication()->GetVersion(other, "job", 0, std::chrono::milliseconds(0), kNoDeadline, &t).ok());
}

class ServerGrantsTest : public VersionsTest {
 protected:
  ServerGrantsTest() : VersionsTest(ReadGrants::Ids{{kStranger}, {}, {}}) {}
};

TEST_F(ServerGrantsTest, TheServersGrantsLetReadersOfEveryJobIn) {
  Save("s1", "/c/model.pt", 4096);
  Publish("s1", {{0, "/c/model.pt", 4096}});
  TagInfo t;
  std::string other = cache_.sessions()->OpenSession(kStranger, 4, kStranger);
  EXPECT_TRUE(cache_.publication()->GetVersion(other, "job", 0, std::chrono::milliseconds(0), kNoDeadline, &t).ok());
  std::string reader = cache_.sessions()->OpenSession(kReader, 3, kReaders);  // granted nothing
  EXPECT_EQ(cache_.publication()->GetVersion(reader, "job", 0, std::chrono::milliseconds(0), kNoDeadline, &t).code(),
            Status::Code::kPermissionDenied);
}

TEST_F(VersionsTest, AFileHeldByAnotherNodeIsListedWithoutMemory) {
  Save("s1", "/c/r0.pt", 4096);
  TagInfo tag = Tag("job", "s1", {{0, "/c/r0.pt", 4096}, {1, "/c/r1.pt", 8192}});
  tag.world_size = 2;
  TagInfo out;
  ASSERT_TRUE(cache_.CommitTag(owner_, tag, &out).ok());
  VersionGrant g;
  ASSERT_TRUE(cache_.publication()->AcquireVersion(owner_, "job", 0, std::chrono::milliseconds(0), &g).ok());
  ASSERT_EQ(g.files.size(), 2u);
  EXPECT_NE(g.files[0].buffer_id, 0u);
  EXPECT_EQ(g.files[1].buffer_id, 0u);
  EXPECT_EQ(g.files[1].path, "/c/r1.pt");
  EXPECT_EQ(g.files[1].size, 8192u);
  EXPECT_EQ(g.files[1].reason, "not held by this server");
  EXPECT_EQ(cache_.Stats().leases, 1u);
}

}  // namespace
}  // namespace tce
