// What one client can make the server remember outside its buffers: job
// names, complete tags, read grants and version leases, each bounded, and
// all of them counted against metadata_budget (cache/metadata_quota.h).
#include <gtest/gtest.h>
#include <unistd.h>

#include "cache/cache.h"
#include "cache/cache_fixture.h"
#include "cache/metadata_quota.h"
#include "common/manual_clock.h"

namespace tce {
namespace {

constexpr uid_t kOwner = 1000, kReader = 1001, kOther = 1002;

TagInfo Tag(const std::string& job, const std::string& name, std::vector<TagFile> files, int32_t world = 1) {
  TagInfo t;
  t.job = job;
  t.tag = name;
  t.world_size = world;
  t.files = std::move(files);
  return t;
}

TEST(MetadataQuota, ChargesAUidsShareThenTheBudgetAndCreditsBack) {
  MetadataLimits limits;
  limits.budget = 1000;
  limits.share_per_uid_percent = 40;  // 400 each
  MetadataQuota q(limits);
  EXPECT_EQ(q.per_uid(), 400u);
  ASSERT_TRUE(q.Charge(1, 400, "a").ok());
  Status s = q.Charge(1, 1, "tag 't' of job 'j'");
  EXPECT_EQ(s.code(), Status::Code::kResourceExhausted);
  EXPECT_EQ(s.message(), "uid 1 may not add tag 't' of job 'j': its records take 400 B of the server's memory, "
                         "and 1 B more would pass its share, 400 B (metadata_share_per_uid of metadata_budget)");
  ASSERT_TRUE(q.Charge(2, 400, "b").ok());
  q.Force(3, 150);  // from metadata: counted whatever the bounds
  s = q.Charge(4, 100, "job 'k'");
  EXPECT_EQ(s.message(), "the server may not add job 'k': its records take 950 B, and 100 B more would pass "
                         "metadata_budget, 1000 B");
  EXPECT_FALSE(q.Fits(4, 100));
  q.Credit(1, 400);
  EXPECT_EQ(q.used_by(1), 0u);
  EXPECT_EQ(q.used(), 550u);
  EXPECT_TRUE(q.Charge(4, 100, "job 'k'").ok());
  q.Credit(9, 10);  // nothing counted: nothing given back
  EXPECT_EQ(q.used(), 650u);
}

class MetadataBoundsTest : public ::testing::Test {
 protected:
  MetadataBoundsTest() : cache_([this] {
    CacheOptions o(64 << 20);
    o.clock = &clock_;
    o.limits = limits_;
    return o;
  }()) {
    owner_ = cache_.sessions()->OpenSession(kOwner, 1, kOwner);
  }

  static SessionLimits Limits() {
    SessionLimits l;
    l.metadata.budget = 1 << 20;
    l.metadata.share_per_uid_percent = 50;
    l.metadata.max_jobs_per_uid = 3;
    l.metadata.max_tags_per_job = 4;
    l.metadata.max_grants_per_job = 5;
    l.metadata.max_version_leases_per_uid = 6;
    l.max_leases_per_session = 4;
    return l;
  }

  Status Save(const std::string& session, const std::string& job, const std::string& tag,
              const std::string& path, int32_t rank = 0) {
    AllocateRequest r{session, job, tag, path, rank, 100};
    AllocateResult a;
    Status s = cache_.Allocate(r, &a);
    if (!s.ok()) return s;
    FileInfo f;
    return cache_.Commit(session, a.allocation_id, {}, &f);
  }
  // Saves the files of a tag with `n` files of rank 0 in job "job" and records it.
  Status SaveAndTag(const std::string& tag, size_t n) {
    std::vector<TagFile> files;
    for (size_t i = 0; i < n; ++i) {
      const std::string path = "/c/" + tag + "/f" + std::to_string(i) + ".pt";
      Status s = Save(owner_, "job", tag, path);
      if (!s.ok()) return s;
      files.push_back({0, path, 100});
    }
    TagInfo out;
    return cache_.CommitTag(owner_, Tag("job", tag, std::move(files)), &out);
  }
  Status Grant(const std::string& session, const std::string& job, const std::vector<uid_t>& uids,
               const std::vector<gid_t>& gids, bool revoke) {
    ReadGrants::Ids ids{{uids.begin(), uids.end()}, {gids.begin(), gids.end()}, {}};
    return cache_.publication()->GrantRead(session, job, &ids, revoke);
  }
  std::vector<std::string> TagNames(const std::string& job) {
    std::vector<std::string> out;
    for (const TagInfo& t : cache_testing::Tags(cache_, job)) out.push_back(t.tag);
    return out;
  }

  const SessionLimits limits_ = Limits();  // before cache_, which is built with them
  ManualClock clock_;
  Cache cache_;
  std::string owner_;
};

TEST_F(MetadataBoundsTest, AUidOwnsAtMostMaxJobsPerUidJobs) {
  for (const char* job : {"a", "b", "c"}) ASSERT_TRUE(Save(owner_, job, "t", std::string("/c/") + job).ok());
  Status s = Save(owner_, "d", "t", "/c/d");
  EXPECT_EQ(s.code(), Status::Code::kResourceExhausted);
  EXPECT_EQ(s.message(), "uid 1000 may not write /c/d in job 'd': it owns 3 jobs on this server (max_jobs_per_uid)");
  std::vector<uid_t> uids{kReader};
  std::vector<gid_t> gids;
  s = Grant(owner_, "e", uids, gids, false);  // a grant would claim a name too
  EXPECT_EQ(s.message(), "uid 1000 may not grant read of job 'e': it owns 3 jobs on this server (max_jobs_per_uid)");
  uid_t owner = 0;
  EXPECT_FALSE(cache_.rings()->JobUid("d", &owner));
  // Another uid still gets its own.
  const std::string other = cache_.sessions()->OpenSession(kOther, 2, kOther);
  EXPECT_TRUE(Save(other, "d", "t", "/c/d").ok());
  // Root too: the bound is per uid, whoever it is.
  const std::string root = cache_.sessions()->OpenSession(0, 3, 0);
  for (const char* job : {"r1", "r2", "r3"}) ASSERT_TRUE(Save(root, job, "t", std::string("/c/") + job).ok());
  EXPECT_EQ(Save(root, "r4", "t", "/c/r4").code(), Status::Code::kResourceExhausted);
  EXPECT_TRUE(Save(root, "a", "t", "/c/a2").ok());  // an administrator's write into a user's job claims nothing
}

TEST_F(MetadataBoundsTest, ATagNamesOnlyFilesItsJobHoldsOrAnotherNodesRanksHold) {
  ASSERT_TRUE(Save(owner_, "job", "s1", "/c/s1/r0.pt", 0).ok());
  ASSERT_TRUE(Save(owner_, "job", "s1", "/c/s1/r1.pt", 1).ok());
  TagInfo out;
  // Rank 1 saved here: its file the tag names must be here too.
  Status s = cache_.CommitTag(owner_, Tag("job", "s1", {{0, "/c/s1/r0.pt", 100}, {1, "/c/s1/other.pt", 100}}, 4), &out);
  EXPECT_EQ(s.code(), Status::Code::kNotFound);
  EXPECT_EQ(s.message(), "tag 's1' names /c/s1/other.pt of rank 1, which job 'job' does not hold here, although "
                         "rank 1 saved files of the tag here");
  // Made-up paths of a rank that saved here: the same.
  std::vector<TagFile> forged{{0, "/c/s1/r0.pt", 100}};
  for (int i = 0; i < 1000; ++i) forged.push_back({0, "/c/forged/" + std::to_string(i), 1});
  EXPECT_EQ(cache_.CommitTag(owner_, Tag("job", "s1", forged, 4), &out).code(), Status::Code::kNotFound);
  // Nothing of the job here at all.
  s = cache_.CommitTag(owner_, Tag("job", "s9", {{2, "/c/s9/r2.pt", 100}}, 4), &out);
  EXPECT_EQ(s.message(), "tag 's9' names no file job 'job' holds on this server: a tag is recorded on a node that "
                         "saved files of it");
  EXPECT_TRUE(cache_testing::Tags(cache_, "job").empty());
  // Ranks 2 and 3 saved nothing here: another node's, accepted.
  ASSERT_TRUE(cache_.CommitTag(owner_, Tag("job", "s1", {{0, "/c/s1/r0.pt", 100}, {1, "/c/s1/r1.pt", 100},
                                                          {2, "/c/s1/r2.pt", 100}, {3, "/c/s1/r3.pt", 100}}, 4),
                               &out).ok());
  EXPECT_EQ(out.files.size(), 4u);
}

TEST_F(MetadataBoundsTest, AJobKeepsItsNewestMaxTagsPerJobTags) {
  for (int i = 1; i <= 6; ++i) {
    ASSERT_TRUE(SaveAndTag("s" + std::to_string(i), 1).ok());
    clock_.Advance(std::chrono::seconds(1));
  }
  EXPECT_EQ(TagNames("job"), (std::vector<std::string>{"s3", "s4", "s5", "s6"}));
  TagInfo t;
  ASSERT_TRUE(cache_.publication()->GetVersion(owner_, "job", 0, std::chrono::milliseconds(0), Clock::TimePoint::max(), &t).ok());
  EXPECT_EQ(t.tag, "s6");  // the newest is the version readers see
  EXPECT_EQ(t.version, 6u);
  // Recording an old tag again replaces it: no other tag goes.
  TagInfo out;
  ASSERT_TRUE(cache_.CommitTag(owner_, Tag("job", "s3", {{0, "/c/s3/f0.pt", 100}}), &out).ok());
  EXPECT_EQ(TagNames("job").size(), 4u);
}

TEST_F(MetadataBoundsTest, TagRecordsStayWithinTheOwnersShareOldestFirst) {
  // 512 KiB share; a tag of 300 files takes ~60 KiB.
  for (int i = 1; i <= 4; ++i) {
    ASSERT_TRUE(SaveAndTag("s" + std::to_string(i), 300).ok());
    clock_.Advance(std::chrono::seconds(1));
  }
  const CacheStats before = cache_.Stats();
  EXPECT_GT(before.metadata_bytes, 4 * 300 * 100u);
  EXPECT_LE(before.metadata_bytes, 512u << 10);
  // Bigger tags push the oldest out to fit.
  ASSERT_TRUE(SaveAndTag("big", 1500).ok());
  const std::vector<std::string> names = TagNames("job");
  EXPECT_EQ(names.back(), "big");
  EXPECT_LT(names.size(), 5u);
  EXPECT_LE(cache_.Stats().metadata_bytes, 512u << 10);
  // One tag larger than the whole share is refused, and the others stay.
  std::vector<TagFile> files;
  for (int i = 0; i < 3000; ++i) files.push_back({1, "/c/huge/" + std::string(100, 'x') + std::to_string(i), 1});
  files.push_back({0, "/c/big/f0.pt", 100});
  TagInfo out;
  Status s = cache_.CommitTag(owner_, Tag("job", "huge", files, 2), &out);
  EXPECT_EQ(s.code(), Status::Code::kResourceExhausted);
  EXPECT_NE(s.message().find("(metadata_share_per_uid of metadata_budget)"), std::string::npos) << s.message();
  EXPECT_EQ(TagNames("job"), names);  // nothing went to make room in vain
}

TEST_F(MetadataBoundsTest, AJobsGrantsAreBoundedAndCounted) {
  ASSERT_TRUE(Save(owner_, "job", "t", "/c/a").ok());
  const uint64_t base = cache_.Stats().metadata_bytes;
  std::vector<uid_t> uids;
  for (uid_t u = 5000; u < 6024; ++u) uids.push_back(u);
  std::vector<gid_t> gids;
  Status s = Grant(owner_, "job", uids, gids, false);
  EXPECT_EQ(s.code(), Status::Code::kResourceExhausted);
  EXPECT_EQ(s.message(), "job 'job' may hold at most 5 granted or revoked uids, gids and nodes (max_grants_per_job); it "
                         "holds 0 and this call names 1024 more");
  EXPECT_EQ(cache_.Stats().metadata_bytes, base);
  uids = {1, 2, 3};
  gids = {7, 8};
  ASSERT_TRUE(Grant(owner_, "job", uids, gids, false).ok());
  EXPECT_EQ(cache_.Stats().metadata_bytes, base + 5 * MetadataQuota::kGrantBytes);
  uids = {1};
  gids.clear();
  ASSERT_TRUE(Grant(owner_, "job", uids, gids, true).ok());  // revoked ones are remembered
  uids = {4};
  EXPECT_EQ(Grant(owner_, "job", uids, gids, false).code(), Status::Code::kResourceExhausted);
}

TEST_F(MetadataBoundsTest, VersionLeasesCountWhateverTheVersionHolds) {
  // Version 1: rank 0's file here, rank 1's on another node.
  ASSERT_TRUE(Save(owner_, "job", "s1", "/c/r0.pt", 0).ok());
  TagInfo out;
  ASSERT_TRUE(cache_.CommitTag(owner_, Tag("job", "s1", {{0, "/c/r0.pt", 100}, {1, "/c/r1.pt", 100}}, 2), &out).ok());
  // Version 2: its one file removed here since.
  ASSERT_TRUE(Save(owner_, "job", "s2", "/c/s2.pt", 0).ok());
  ASSERT_TRUE(cache_.CommitTag(owner_, Tag("job", "s2", {{0, "/c/s2.pt", 100}}), &out).ok());
  FileInfo removed;
  ASSERT_TRUE(cache_.Remove(owner_, "job", "/c/s2.pt", &removed).ok());

  // A lease on version 1 is 2 of the session's 4 leases (its file, itself).
  const std::string reader = cache_.sessions()->OpenSession(kOwner, 2, kOwner);
  VersionGrant g;
  ASSERT_TRUE(cache_.publication()->AcquireVersion(reader, "job", 1, std::chrono::milliseconds(0), &g).ok());
  ASSERT_TRUE(cache_.publication()->AcquireVersion(reader, "job", 1, std::chrono::milliseconds(0), &g).ok());
  Status s = cache_.publication()->AcquireVersion(reader, "job", 1, std::chrono::milliseconds(0), &g);
  EXPECT_EQ(s.code(), Status::Code::kResourceExhausted);
  // One on version 2, which holds nothing here, is one lease all the same.
  const std::string far = cache_.sessions()->OpenSession(kOwner, 3, kOwner);
  int taken = 0;
  for (int i = 0; i < 100; ++i) {
    s = cache_.publication()->AcquireVersion(far, "job", 2, std::chrono::milliseconds(0), &g);
    if (!s.ok()) break;
    EXPECT_TRUE(g.files.at(0).buffer_id == 0);
    ++taken;
  }
  EXPECT_EQ(taken, 4);
  EXPECT_EQ(s.code(), Status::Code::kResourceExhausted);
  // Per uid, over all its sessions: 6.
  EXPECT_EQ(cache_.Stats().version_leases, 6u);
  const std::string third = cache_.sessions()->OpenSession(kOwner, 4, kOwner);
  s = cache_.publication()->AcquireVersion(third, "job", 2, std::chrono::milliseconds(0), &g);
  EXPECT_EQ(s.message(), "uid 1000 holds 6 version leases (max_version_leases_per_uid): release one first");
  // Another uid still gets its own (a granted reader).
  std::vector<uid_t> uids{kReader};
  std::vector<gid_t> gids;
  ASSERT_TRUE(Grant(owner_, "job", uids, gids, false).ok());
  const std::string granted = cache_.sessions()->OpenSession(kReader, 5, kReader);
  EXPECT_TRUE(cache_.publication()->AcquireVersion(granted, "job", 2, std::chrono::milliseconds(0), &g).ok());
  // Closing the sessions gives every lease and its bytes back.
  const uint64_t with = cache_.Stats().metadata_bytes;
  for (const std::string& sess : {reader, far, third, granted}) cache_.sessions()->CloseSession(sess);
  EXPECT_EQ(cache_.Stats().version_leases, 0u);
  EXPECT_EQ(with - cache_.Stats().metadata_bytes,
            2 * (MetadataQuota::kLeaseBytes + MetadataQuota::kFileLeaseBytes) + 5 * MetadataQuota::kLeaseBytes);
}

TEST_F(MetadataBoundsTest, ARevokedGrantEndsTheReadersLeases) {
  ASSERT_TRUE(Save(owner_, "job", "s1", "/c/m.pt").ok());
  TagInfo out;
  ASSERT_TRUE(cache_.CommitTag(owner_, Tag("job", "s1", {{0, "/c/m.pt", 100}}), &out).ok());
  std::vector<uid_t> uids{kReader};
  std::vector<gid_t> gids;
  ASSERT_TRUE(Grant(owner_, "job", uids, gids, false).ok());
  const std::string reader = cache_.sessions()->OpenSession(kReader, 2, kReader);
  VersionGrant g;
  ASSERT_TRUE(cache_.publication()->AcquireVersion(reader, "job", 0, std::chrono::milliseconds(0), &g).ok());
  std::chrono::milliseconds granted{0};
  ASSERT_TRUE(cache_.publication()->RenewVersion(reader, g.lease_id, std::chrono::milliseconds(0), &granted).ok());
  EXPECT_EQ(cache_.Stats().version_leases, 1u);
  uids = {kReader};
  ASSERT_TRUE(Grant(owner_, "job", uids, gids, true).ok());
  EXPECT_EQ(cache_.Stats().version_leases, 0u);  // ended at the revocation
  Status s = cache_.publication()->RenewVersion(reader, g.lease_id, std::chrono::milliseconds(0), &granted);
  EXPECT_EQ(s.code(), Status::Code::kNotFound);
  EXPECT_EQ(s.message(), "no version lease " + std::to_string(g.lease_id) +
                             " in this session (released, expired, revoked, or never granted)");
  // Its buffer is never reused: the reader may still map it.
  const uint64_t buffers = cache_.Stats().buffers;
  ASSERT_TRUE(Save(owner_, "job", "s2", "/c/m.pt").ok());
  EXPECT_EQ(cache_.Stats().buffers_reused, 0u);
  EXPECT_EQ(cache_.Stats().buffers, buffers);
}

TEST_F(MetadataBoundsTest, ARestartKeepsTheNewestMaxTagsPerJob) {
  std::vector<TagInfo> recorded;
  for (int i = 1; i <= 7; ++i) {
    TagInfo t = Tag("job", "s" + std::to_string(i), {{0, "/c/" + std::to_string(i), 1}});
    t.complete_unix_ns = i;
    t.version = i;
    recorded.push_back(t);
  }
  cache_.Restore({}, recorded);
  EXPECT_EQ(TagNames("job"), (std::vector<std::string>{"s4", "s5", "s6", "s7"}));
  EXPECT_GT(cache_.Stats().metadata_bytes, 0u);
}

}  // namespace
}  // namespace tce
