// Published versions: numbering, the wait for a newer one, version leases,
// read grants (cache/cache_versions.cc, tag_registry, read_grants).
#include <gtest/gtest.h>
#include <unistd.h>

#include <thread>

#include "cache/cache.h"
#include "cache/tag_registry.h"
#include "cache/weight_files.h"
#include "common/manual_clock.h"

namespace tce {
namespace {

constexpr uid_t kOwner = 1000, kReader = 1001, kStranger = 1002;
constexpr gid_t kReaders = 2000;
constexpr auto kNoDeadline = Clock::TimePoint::max();

TagInfo Tag(const std::string& job, const std::string& name, std::vector<TagFile> files) {
  TagInfo t;
  t.job = job;
  t.tag = name;
  t.world_size = 1;
  t.files = std::move(files);
  return t;
}

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

class VersionsTest : public ::testing::Test {
 protected:
  VersionsTest() : cache_(64 << 20, {}, Env::Default(), std::chrono::seconds(30), 0, &clock_) {
    SessionLimits limits;
    limits.version_lease = std::chrono::seconds(60);
    limits.version_lease_max = std::chrono::seconds(120);
    cache_.SetSessionLimits(limits);
    owner_ = cache_.OpenSession(kOwner, 1, kOwner);
  }

  // Saves `path` (as the owner) with `size` bytes of `fill`; returns its buffer.
  uint64_t Save(const std::string& tag, const std::string& path, uint64_t size) {
    AllocateRequest r{owner_, "job", tag, path, 0, size};
    AllocateResult a;
    EXPECT_TRUE(cache_.Allocate(r, &a).ok());
    FileInfo f;
    EXPECT_TRUE(cache_.Commit(owner_, a.allocation_id, {}, &f).ok());
    return a.buffer_id;
  }
  TagInfo Publish(const std::string& tag, std::vector<TagFile> files) {
    TagInfo out;
    Status s = cache_.CommitTag(owner_, Tag("job", tag, std::move(files)), &out);
    EXPECT_TRUE(s.ok()) << s.ToString();
    return out;
  }

  ManualClock clock_;
  Cache cache_;
  std::string owner_;
};

TEST_F(VersionsTest, NewestVersionAndNotFoundWithoutWaiting) {
  TagInfo t;
  Status s = cache_.GetVersion(owner_, "job", 0, std::chrono::milliseconds(0), kNoDeadline, &t);
  EXPECT_EQ(s.code(), Status::Code::kNotFound);
  EXPECT_EQ(s.message(), "job 'job' has no version published");
  Save("s1", "/c/s1.pt", 100);
  Publish("s1", {{0, "/c/s1.pt", 100}});
  ASSERT_TRUE(cache_.GetVersion(owner_, "job", 0, std::chrono::milliseconds(0), kNoDeadline, &t).ok());
  EXPECT_EQ(t.version, 1u);
  EXPECT_EQ(t.tag, "s1");
  s = cache_.GetVersion(owner_, "job", 1, std::chrono::milliseconds(0), kNoDeadline, &t);
  EXPECT_EQ(s.message(), "job 'job' has no version newer than 1");
}

TEST_F(VersionsTest, AWaitingReaderIsAnsweredWhenTheVersionIsPublished) {
  Save("s1", "/c/s1.pt", 100);
  Publish("s1", {{0, "/c/s1.pt", 100}});
  const uint64_t before = clock_.waits();
  TagInfo got;
  Status result;
  std::thread reader([&] {
    result = cache_.GetVersion(owner_, "job", 1, std::chrono::seconds(30), kNoDeadline, &got);
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
    result = cache_.GetVersion(owner_, "job", 0, std::chrono::seconds(5), kNoDeadline, &got);
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
  std::string reader = cache_.OpenSession(kOwner, 2, kOwner);
  VersionGrant g;
  ASSERT_TRUE(cache_.AcquireVersion(reader, "job", 0, std::chrono::milliseconds(0), &g).ok());
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
  ASSERT_TRUE(cache_.FdFor(reader, first, &fd, &writable, &cap).ok());  // still readable
  EXPECT_FALSE(writable);
  close(fd);
  // Version 1 is gone for a new reader: its file was saved again.
  VersionGrant again;
  Status s = cache_.AcquireVersion(owner_, "job", 1, std::chrono::milliseconds(0), &again);
  EXPECT_EQ(s.code(), Status::Code::kFailedPrecondition);
  EXPECT_EQ(s.message(),
            "version 1 of job 'job' is gone: /c/model.pt was saved again after it was published "
            "(read a newer version)");
  ASSERT_TRUE(cache_.ReleaseVersion(reader, g.lease_id).ok());
  EXPECT_EQ(cache_.ReleaseVersion(reader, g.lease_id).code(), Status::Code::kNotFound);
  EXPECT_EQ(cache_.Stats().version_leases, 0u);
  EXPECT_EQ(cache_.Stats().leases, 0u);
}

TEST_F(VersionsTest, AnUnrenewedLeaseEndsAtItsTimeAndItsBuffersAreNotReused) {
  const uint64_t first = Save("s1", "/c/model.pt", 4096);
  Publish("s1", {{0, "/c/model.pt", 4096}});
  std::string reader = cache_.OpenSession(kOwner, 2, kOwner);
  VersionGrant g;
  ASSERT_TRUE(cache_.AcquireVersion(reader, "job", 1, std::chrono::seconds(1000), &g).ok());
  EXPECT_EQ(g.lease, std::chrono::seconds(120));  // cut to the maximum
  clock_.Advance(std::chrono::seconds(100));
  std::chrono::milliseconds granted{0};
  ASSERT_TRUE(cache_.RenewVersion(reader, g.lease_id, std::chrono::seconds(10), &granted).ok());
  EXPECT_EQ(granted, std::chrono::seconds(10));
  clock_.Advance(std::chrono::milliseconds(9999));
  EXPECT_EQ(cache_.ExpireVersionLeases(), 0u);
  clock_.Advance(std::chrono::milliseconds(1));
  EXPECT_EQ(cache_.ExpireVersionLeases(), 1u);
  EXPECT_EQ(cache_.Stats().leases, 0u);
  EXPECT_EQ(cache_.RenewVersion(reader, g.lease_id, std::chrono::seconds(10), &granted).code(),
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
  std::string reader = cache_.OpenSession(kOwner, 2, kOwner);
  VersionGrant g;
  ASSERT_TRUE(cache_.AcquireVersion(reader, "job", 0, std::chrono::milliseconds(0), &g).ok());
  int fd = -1;
  bool writable = true;
  uint64_t cap = 0;
  ASSERT_TRUE(cache_.FdFor(reader, first, &fd, &writable, &cap, /*keep_mapped=*/true).ok());
  close(fd);
  ASSERT_TRUE(cache_.ReleaseVersion(reader, g.lease_id).ok());
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
  ASSERT_TRUE(cache_.AcquireVersion(reader, "job", 0, std::chrono::milliseconds(0), &g).ok());
  EXPECT_EQ(g.unmap_buffer_ids, std::vector<uint64_t>{first});
}

TEST_F(VersionsTest, ASessionsEndEndsItsVersionLeases) {
  Save("s1", "/c/model.pt", 4096);
  Publish("s1", {{0, "/c/model.pt", 4096}});
  std::string reader = cache_.OpenSession(kOwner, 2, kOwner);
  VersionGrant g;
  ASSERT_TRUE(cache_.AcquireVersion(reader, "job", 0, std::chrono::milliseconds(0), &g).ok());
  cache_.CloseSession(reader);
  EXPECT_EQ(cache_.Stats().version_leases, 0u);
  EXPECT_EQ(cache_.Stats().leases, 0u);
}

TEST_F(VersionsTest, OtherUsersReadOnlyWithAGrantAndOnlyPublishedVersions) {
  const uint64_t buf = Save("s1", "/c/model.pt", 4096);
  Publish("s1", {{0, "/c/model.pt", 4096}});
  std::string reader = cache_.OpenSession(kReader, 3, kStranger);
  std::string stranger = cache_.OpenSession(kStranger, 4, kStranger);
  TagInfo t;
  VersionGrant g;
  Status s = cache_.AcquireVersion(reader, "job", 0, std::chrono::milliseconds(0), &g);
  EXPECT_EQ(s.code(), Status::Code::kPermissionDenied);
  EXPECT_EQ(s.message(), "uid 1001 may not read the published versions of job 'job' (it belongs to uid 1000): "
                         "no read grant for uid 1001 or gid 1002");
  // Only the owner grants.
  ReadGrants::Ids ids{{kReader}, {}, {}};
  EXPECT_EQ(cache_.GrantRead(stranger, "job", &ids, false).code(), Status::Code::kPermissionDenied);
  ids = {{kReader}, {}, {}};
  ASSERT_TRUE(cache_.GrantRead(owner_, "job", &ids, false).ok());
  EXPECT_EQ(ids.uids, std::set<uid_t>{kReader});
  ASSERT_TRUE(cache_.GetVersion(reader, "job", 0, std::chrono::milliseconds(0), kNoDeadline, &t).ok());
  ASSERT_TRUE(cache_.AcquireVersion(reader, "job", 0, std::chrono::milliseconds(0), &g).ok());
  int fd = -1;
  bool writable = true;
  uint64_t cap = 0;
  ASSERT_TRUE(cache_.FdFor(reader, buf, &fd, &writable, &cap).ok());
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
  EXPECT_EQ(cache_.GetVersion(stranger, "job", 0, std::chrono::milliseconds(0), kNoDeadline, &t).code(),
            Status::Code::kPermissionDenied);
  // Revoked: the next read is refused, saying so.
  ASSERT_TRUE(cache_.ReleaseVersion(reader, g.lease_id).ok());
  ids = {{kReader}, {}, {}};
  ASSERT_TRUE(cache_.GrantRead(owner_, "job", &ids, true).ok());
  EXPECT_TRUE(ids.uids.empty());
  s = cache_.AcquireVersion(reader, "job", 0, std::chrono::milliseconds(0), &g);
  EXPECT_EQ(s.message(), "uid 1001 may not read the published versions of job 'job' (it belongs to uid 1000): "
                         "the owner revoked the read grant of uid 1001");
  // A buffer another uid held an fd of is never reused: replaced, it goes.
  const uint64_t buffers = cache_.Stats().buffers;
  Save("s2", "/c/model.pt", 4096);
  EXPECT_EQ(cache_.Stats().buffers, buffers);
  EXPECT_EQ(cache_.Stats().buffers_reused, 0u);
}

TEST_F(VersionsTest, AGroupGrantAndTheServersGrantsLetReadersIn) {
  Save("s1", "/c/model.pt", 4096);
  Publish("s1", {{0, "/c/model.pt", 4096}});
  std::string reader = cache_.OpenSession(kReader, 3, kReaders);
  ReadGrants::Ids ids{{}, {kReaders}, {}};
  ASSERT_TRUE(cache_.GrantRead(owner_, "job", &ids, false).ok());
  TagInfo t;
  EXPECT_TRUE(cache_.GetVersion(reader, "job", 0, std::chrono::milliseconds(0), kNoDeadline, &t).ok());
  std::string other = cache_.OpenSession(kStranger, 4, kStranger);
  EXPECT_FALSE(cache_.GetVersion(other, "job", 0, std::chrono::milliseconds(0), kNoDeadline, &t).ok());
  SessionLimits limits;
  limits.read_grants.uids = {kStranger};
  cache_.SetSessionLimits(limits);
  EXPECT_TRUE(cache_.GetVersion(other, "job", 0, std::chrono::milliseconds(0), kNoDeadline, &t).ok());
}

TEST_F(VersionsTest, AFileHeldByAnotherNodeIsListedWithoutMemory) {
  Save("s1", "/c/r0.pt", 4096);
  TagInfo tag = Tag("job", "s1", {{0, "/c/r0.pt", 4096}, {1, "/c/r1.pt", 8192}});
  tag.world_size = 2;
  TagInfo out;
  ASSERT_TRUE(cache_.CommitTag(owner_, tag, &out).ok());
  VersionGrant g;
  ASSERT_TRUE(cache_.AcquireVersion(owner_, "job", 0, std::chrono::milliseconds(0), &g).ok());
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

namespace tce {
namespace {

// The source's side of a follower's questions, and the follower's replicas.
class FollowTest : public VersionsTest {
 protected:
  // A buffer of the cache with `bytes` in it, as a follower's transfer fills one.
  std::unique_ptr<Buffer> Filled(const std::string& bytes) {
    std::unique_ptr<Buffer> mem;
    EXPECT_TRUE(cache_.ReserveRecovery(bytes.size(), &mem).ok());
    EXPECT_EQ(pwrite(mem->fd(), bytes.data(), bytes.size(), 0), static_cast<ssize_t>(bytes.size()));
    return mem;
  }
};

TEST_F(FollowTest, AFollowingNodeIsCheckedAgainstTheNodesTheOwnerGranted) {
  Save("s1", "/c/m.pt", 4096);
  Publish("s1", {{0, "/c/m.pt", 4096}});
  const std::string granted = "10.0.0.2:7070", other = "10.0.0.3:7070";
  TagInfo t;
  std::vector<std::string> nodes;
  const auto now = std::chrono::milliseconds(0);
  Status s = cache_.PeerGetVersion("job", 0, 0, now, granted, &t, &nodes);
  EXPECT_EQ(s.code(), Status::Code::kPermissionDenied);
  EXPECT_EQ(s.message(), "node 10.0.0.2:7070 may not follow job 'job' here: no read grant for node 10.0.0.2:7070");
  EXPECT_EQ(s.message().find(std::to_string(kOwner)), std::string::npos) << "a peer is not told whose the job is";
  ReadGrants::Ids ids{{}, {}, {granted}};
  ASSERT_TRUE(cache_.GrantRead(owner_, "job", &ids, false).ok());
  EXPECT_EQ(ids.nodes, std::set<std::string>{granted});
  ASSERT_TRUE(cache_.PeerGetVersion("job", 0, 0, now, granted, &t, &nodes).ok());
  EXPECT_EQ(t.version, 1u);
  EXPECT_EQ(nodes, std::vector<std::string>{granted});
  EXPECT_EQ(cache_.PeerGetVersion("job", 0, 0, now, other, &t, &nodes).code(), Status::Code::kPermissionDenied);
  EXPECT_EQ(cache_.PeerGetVersion("job", 1, 0, now, granted, &t, &nodes).code(), Status::Code::kDeadlineExceeded);
  EXPECT_EQ(cache_.PeerGetVersion("job", 1, t.epoch, now, granted, &t, &nodes).code(),
            Status::Code::kDeadlineExceeded);
  ASSERT_TRUE(cache_.PeerGetVersion("job", 5, t.epoch + 1, now, granted, &t, &nodes).ok())
      << "a version above 5 of another numbering: any version here is newer";
  EXPECT_EQ(t.version, 1u);
  EXPECT_EQ(cache_.PeerGetVersion("nojob", 0, 0, now, granted, &t, &nodes).code(), Status::Code::kNotFound);
  EXPECT_TRUE(cache_.CheckPeerVersionRead("job", "s1", "/c/m.pt", granted).ok());
  EXPECT_EQ(cache_.CheckPeerVersionRead("job", "s1", "/c/other.pt", granted).message(),
            "/c/other.pt is not a file of version 1 (s1) of job 'job' here");
  EXPECT_EQ(cache_.CheckPeerVersionRead("job", "s1", "/c/m.pt", other).code(), Status::Code::kPermissionDenied);
  ASSERT_TRUE(cache_.GrantRead(owner_, "job", &ids, /*revoke=*/true).ok());
  s = cache_.CheckPeerVersionRead("job", "s1", "/c/m.pt", granted);
  EXPECT_EQ(s.message(),
            "node 10.0.0.2:7070 may not follow job 'job' here: the owner revoked the read grant of node 10.0.0.2:7070");
}

TEST(WeightFiles, AreTheTagsFilesButOptimizerSchedulerAndRngStates) {
  for (const char* p : {"/c/model.safetensors", "/c/global_step3/mp_rank_00_model_states.pt", "/c/__0_0.distcp",
                        "/c/.metadata", "/c/pytorch_model.bin", "/c/optimizer_dir/model.pt"})
    EXPECT_TRUE(IsWeightFile(p)) << p;
  for (const char* p : {"/c/global_step3/bf16_zero_pp_rank_0_mp_rank_00_optim_states.pt", "/c/optimizer.pt",
                        "/c/scheduler.pt", "/c/rng_state_0.pth", "/c/trainer_state.json", "/c/training_args.bin"})
    EXPECT_FALSE(IsWeightFile(p)) << p;
}

TEST_F(FollowTest, AFollowingNodeIsGivenTheWeightFilesOfAVersionOnly) {
  Save("s1", "/c/mp_rank_00_model_states.pt", 4096);
  Save("s1", "/c/zero_pp_rank_0_mp_rank_00_optim_states.pt", 8192);
  Publish("s1",
          {{0, "/c/mp_rank_00_model_states.pt", 4096}, {0, "/c/zero_pp_rank_0_mp_rank_00_optim_states.pt", 8192}});
  const std::string node = "10.0.0.2:7070";
  ReadGrants::Ids ids{{}, {}, {node}};
  ASSERT_TRUE(cache_.GrantRead(owner_, "job", &ids, false).ok());
  TagInfo t;
  std::vector<std::string> nodes;
  ASSERT_TRUE(cache_.PeerGetVersion("job", 0, 0, std::chrono::milliseconds(0), node, &t, &nodes).ok());
  ASSERT_EQ(t.files.size(), 1u);
  EXPECT_EQ(t.files[0].path, "/c/mp_rank_00_model_states.pt");
  EXPECT_TRUE(cache_.CheckPeerVersionRead("job", "s1", "/c/mp_rank_00_model_states.pt", node).ok());
  Status s = cache_.CheckPeerVersionRead("job", "s1", "/c/zero_pp_rank_0_mp_rank_00_optim_states.pt", node);
  EXPECT_EQ(s.code(), Status::Code::kPermissionDenied);
  EXPECT_EQ(s.message(), "/c/zero_pp_rank_0_mp_rank_00_optim_states.pt is no weight file of job 'job': optimizer, "
                         "scheduler and RNG states are not given to following nodes");
}

TEST_F(FollowTest, AFollowedJobKeepsItsSourcesEpochAndRefusesAbsurdJumps) {
  ASSERT_TRUE(cache_.AddFollower("fj", kOwner, kReader).ok());
  auto version = [](const std::string& tag, uint64_t v, uint64_t epoch) {
    TagInfo t = Tag("fj", tag, {{0, "/c/" + tag + ".safetensors", 5}});
    t.complete_unix_ns = static_cast<int64_t>(v) * 100 + static_cast<int64_t>(epoch), t.version = v, t.epoch = epoch;
    return t;
  };
  for (uint64_t v : {1, 2, 3}) ASSERT_TRUE(cache_.AdoptFollowed(version("s" + std::to_string(v), v, 7)).ok());
  EXPECT_EQ(cache_.AdoptFollowed(version("noepoch", 4, 0)).code(), Status::Code::kDataLoss);
  // A forged number far above the newest would leave every real one unseen.
  const uint64_t forged = 3 + TagRegistry::kMaxVersionJump + 1;
  Status s = cache_.AdoptFollowed(version("forged", forged, 7));
  EXPECT_EQ(s.code(), Status::Code::kDataLoss);
  EXPECT_EQ(s.message(), "the source's version of job 'fj': version " + std::to_string(forged) +
                             " is more than 1048576 above 3, the newest here of its numbering (epoch 7)");
  ASSERT_TRUE(cache_.AdoptFollowed(version("s4", 4, 7)).ok());
  const std::string reader = cache_.OpenSession(kReader, 9, kReader);
  TagInfo got;
  ASSERT_TRUE(cache_.GetVersion(reader, "fj", 0, std::chrono::milliseconds(0), kNoDeadline, &got).ok());
  EXPECT_EQ(got.version, 4u);
  // The source lost its state and numbers from 1 again, in a new epoch: a
  // reader that saw version 4 is given version 1 of it.
  EXPECT_EQ(cache_.AdoptFollowed(version("r0", TagRegistry::kMaxVersionJump + 1, 9)).code(),
            Status::Code::kDataLoss);
  ASSERT_TRUE(cache_.AdoptFollowed(version("r1", 1, 9)).ok());
  ASSERT_TRUE(cache_.GetVersion(reader, "fj", 4, std::chrono::milliseconds(0), kNoDeadline, &got).ok());
  EXPECT_EQ(std::make_pair(got.tag, got.version), std::make_pair(std::string("r1"), uint64_t{1}));
  EXPECT_EQ(cache_.GetVersion(reader, "fj", 1, std::chrono::milliseconds(0), kNoDeadline, &got).code(),
            Status::Code::kNotFound);
  ASSERT_TRUE(cache_.AdoptFollowed(version("r2", 2, 9)).ok());
  ASSERT_TRUE(cache_.GetVersion(reader, "fj", 1, std::chrono::milliseconds(0), kNoDeadline, &got).ok());
  EXPECT_EQ(got.version, 2u);
  EXPECT_FALSE(cache_.VersionTag("fj", "s3", &got)) << "the old numbering's versions are gone";
}

TEST_F(FollowTest, AVersionsDigestsAreThoseItsPublisherComputesOfItsOwnFiles) {
  Save("s1", "/c/m.safetensors", 4096);
  TagInfo t = Tag("job", "s1", {{0, "/c/m.safetensors", 4096}, {0, "/c/elsewhere.safetensors", 10}});
  for (TagFile& f : t.files) f.crc32 = 1234, f.has_crc32 = true;  // a client's word: not a digest
  TagInfo out;
  ASSERT_TRUE(cache_.CommitTag(owner_, t, &out).ok());
  EXPECT_FALSE(out.files[0].has_crc32 || out.files[1].has_crc32);
  std::vector<RingStore::DigestPin> pins;
  cache_.VersionDigests(&out, &pins);
  ASSERT_EQ(pins.size(), 1u) << "this node's own file in memory only";
  EXPECT_EQ(out.files[pins[0].file].path, "/c/m.safetensors");
  close(pins[0].fd);
  cache_.EndPeerRead(pins[0].buffer_id);
  out.files[pins[0].file].crc32 = 42, out.files[pins[0].file].has_crc32 = true;
  cache_.RecordDigests(out);
  TagInfo again;
  ASSERT_TRUE(cache_.VersionTag("job", "s1", &again));
  cache_.VersionDigests(&again, &pins);
  EXPECT_TRUE(pins.empty()) << "computed once";
  ASSERT_EQ(again.files[1].path, "/c/m.safetensors");
  EXPECT_TRUE(again.files[1].has_crc32);
  EXPECT_EQ(again.files[1].crc32, 42u);
  EXPECT_FALSE(again.files[0].has_crc32) << "not held here";
  // A followed version keeps its source's digests; a replica is never digested here.
  ASSERT_TRUE(cache_.AddFollower("fj", kOwner, kReader).ok());
  TagInfo v = Tag("fj", "step1", {{0, "/c/w.safetensors", 5}, {0, "/c/x.safetensors", 5}});
  v.complete_unix_ns = 1, v.version = 1, v.epoch = 3, v.files[0].crc32 = 99, v.files[0].has_crc32 = true;
  ASSERT_TRUE(cache_.AdoptFollowed(v).ok());
  FileInfo f;
  f.job = "fj", f.path = "/c/x.safetensors", f.size = 5;
  ASSERT_TRUE(cache_.AdoptReplica(f, 1, Filled("hello")).ok());
  TagInfo followed;
  ASSERT_TRUE(cache_.VersionTag("fj", "step1", &followed));
  cache_.VersionDigests(&followed, &pins);
  EXPECT_TRUE(pins.empty());
  EXPECT_EQ(followed.files[0].crc32, 99u);
  EXPECT_FALSE(followed.files[1].has_crc32);
}

TEST_F(FollowTest, AFollowedJobIsThisServersAndItsFollowersRead) {
  constexpr uid_t kServer = 500;
  TagInfo v1 = Tag("fj", "step1", {{0, "/c/w.safetensors", 5}});
  v1.complete_unix_ns = 100, v1.version = 1, v1.epoch = 7;
  EXPECT_EQ(cache_.AdoptFollowed(v1).code(), Status::Code::kFailedPrecondition) << "not followed here";
  ASSERT_TRUE(cache_.AddFollower("fj", kServer, kReader).ok());
  ASSERT_TRUE(cache_.AdoptFollowed(v1).ok());
  uid_t owner = 0;
  ASSERT_TRUE(cache_.JobUid("fj", &owner));
  EXPECT_EQ(owner, kServer) << "never a uid a source names";
  TagInfo got;
  const std::string reader = cache_.OpenSession(kReader, 9, kReader);
  EXPECT_TRUE(cache_.GetVersion(reader, "fj", 0, std::chrono::milliseconds(0), kNoDeadline, &got).ok());
  const std::string stranger = cache_.OpenSession(kStranger, 10, kStranger);
  EXPECT_EQ(cache_.GetVersion(stranger, "fj", 0, std::chrono::milliseconds(0), kNoDeadline, &got).code(),
            Status::Code::kPermissionDenied);
  AllocateResult a;
  EXPECT_EQ(cache_.Allocate({reader, "fj", "t", "/c/x.pt", 0, 10}, &a).code(), Status::Code::kPermissionDenied)
      << "a follower reads the versions, nothing else";
  // A local user's job of that name is not followed over.
  Save("s1", "/c/m.pt", 4096);
  Status s = cache_.AddFollower("job", kServer, kReader);
  EXPECT_EQ(s.code(), Status::Code::kFailedPrecondition);
  EXPECT_EQ(s.message(), "job 'job' belongs to uid 1000 here: a followed job is this server's own (uid 500), so "
                         "it cannot follow a job of that name");
}

TEST_F(FollowTest, AFollowedVersionsReplicaServesThatVersionOnly) {
  // This cache follows "fj", owned by kOwner at the source; kReader reads.
  TagInfo v1 = Tag("fj", "step1", {{0, "/c/w.safetensors", 5}});
  v1.complete_unix_ns = 100, v1.version = 1, v1.epoch = 7;
  ASSERT_TRUE(cache_.AddFollower("fj", kOwner, kReader).ok());
  ASSERT_TRUE(cache_.AdoptFollowed(v1).ok());
  std::string reader = cache_.OpenSession(kReader, 9, kReader);
  TagInfo got;
  ASSERT_TRUE(cache_.GetVersion(reader, "fj", 0, std::chrono::milliseconds(0), kNoDeadline, &got).ok());
  EXPECT_EQ(got.version, 1u);
  EXPECT_FALSE(cache_.HoldsInMemory("fj", "/c/w.safetensors", "step1"));
  FileInfo f;
  f.job = "fj", f.path = "/c/w.safetensors", f.size = 5;
  ASSERT_TRUE(cache_.AdoptReplica(f, 1, Filled("hello")).ok());
  EXPECT_TRUE(cache_.HoldsInMemory("fj", "/c/w.safetensors", "step1"));
  EXPECT_EQ(cache_.Stats().replica_files, 1u);
  VersionGrant g;
  ASSERT_TRUE(cache_.AcquireVersion(reader, "fj", 1, std::chrono::milliseconds(0), &g).ok());
  ASSERT_NE(g.files[0].buffer_id, 0u);
  ASSERT_TRUE(cache_.ReleaseVersion(reader, g.lease_id).ok());
  // Version 2 names the same path: the replica is version 1's, not its.
  TagInfo v2 = Tag("fj", "step2", {{0, "/c/w.safetensors", 5}});
  v2.complete_unix_ns = 200, v2.version = 2, v2.epoch = 7;
  ASSERT_TRUE(cache_.AdoptFollowed(v2).ok());
  EXPECT_FALSE(cache_.HoldsInMemory("fj", "/c/w.safetensors", "step2"));
  ASSERT_TRUE(cache_.AcquireVersion(reader, "fj", 2, std::chrono::milliseconds(0), &g).ok());
  EXPECT_EQ(g.files[0].buffer_id, 0u);
  FileInfo out;
  int fd = -1;
  EXPECT_EQ(cache_.StartVersionRead("fj", "/c/w.safetensors", "step2", &out, &fd).code(),
            Status::Code::kNotFound);
  ASSERT_TRUE(cache_.StartVersionRead("fj", "/c/w.safetensors", "step1", &out, &fd).ok());
  close(fd);
  cache_.EndPeerRead(out.buffer_id);
  // A replica of a size the version does not list, or of a version not
  // here, is refused.
  f.size = 6;
  EXPECT_EQ(cache_.AdoptReplica(f, 2, Filled("hello!")).code(), Status::Code::kInvalidArgument);
  f.size = 5;
  EXPECT_EQ(cache_.AdoptReplica(f, 7, Filled("hello")).code(), Status::Code::kNotFound);
  // The replica of version 1 is free once version 2's is adopted; version
  // 3's reuses its buffer (same id), and a reader keeping it mapped stays.
  ASSERT_TRUE(cache_.ReleaseVersion(reader, g.lease_id).ok());
  std::unique_ptr<Buffer> mem2 = Filled("world");
  f.size = 5;
  ASSERT_TRUE(cache_.AdoptReplica(f, 2, std::move(mem2)).ok());
  TagInfo v3 = Tag("fj", "step3", {{0, "/c/w.safetensors", 5}});
  v3.complete_unix_ns = 300, v3.version = 3, v3.epoch = 7;
  ASSERT_TRUE(cache_.AdoptFollowed(v3).ok());
  const uint64_t reused_before = cache_.Stats().buffers_reused;
  std::unique_ptr<Buffer> mem3;
  ASSERT_TRUE(cache_.ReserveReplica("fj", 5, &mem3).ok());
  EXPECT_EQ(mem3->id(), out.buffer_id) << "version 1's replica buffer, free again";
  EXPECT_EQ(cache_.Stats().buffers_reused, reused_before + 1);
  ASSERT_EQ(pwrite(mem3->fd(), "third", 5, 0), 5);
  ASSERT_TRUE(cache_.AdoptReplica(f, 3, std::move(mem3)).ok());
  EXPECT_TRUE(cache_.HoldsInMemory("fj", "/c/w.safetensors", "step3"));
}

}  // namespace
}  // namespace tce
