// Two users and root on one server: what each may do with the others'
// jobs, files, tags, rings and buffers, and what an administrator may.
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstring>

#include "cache/cache_fixture.h"

namespace tce {
namespace {
using namespace cache_testing;

// Two users and root on one server: what each may do with the others' jobs.
class CacheAccessTest : public CacheTest {
 protected:
  explicit CacheAccessTest(const SessionLimits& limits = SessionLimits()) : CacheTest(64 * kMiB, true, limits) {}
  // Alice saves a file; root's session looks it up. `admin`: what the
  // cache says of root.
  Status RootLooksUpAlicesFile(bool* admin) {
    Save(alice_, "/c/a.pt", 1000);
    Status s = cache_.sessions()->CheckCaller(root_, admin);
    if (!s.ok()) return s;
    FileInfo f;
    uint64_t lease = 0;
    std::vector<uint64_t> unmap;
    return cache_.Lookup(root_, "job", "/c/a.pt", false, &f, &lease, &unmap);
  }

  const std::string alice_ = cache_.sessions()->OpenSession(1001, 11), bob_ = cache_.sessions()->OpenSession(1002, 12),
                    root_ = cache_.sessions()->OpenSession(0, 13);
};

TEST_F(CacheAccessTest, AClaimHoldsTenMinutesUnlessItsNodeIsDroppedForTheJob) {
  EXPECT_EQ(cache_.storage_access()->ClaimRead("job", "/c/a.pt", "c:1"), "c:1");
  EXPECT_EQ(cache_.storage_access()->ClaimRead("job", "/c/b.pt", "c:1"), "c:1");
  EXPECT_EQ(cache_.storage_access()->ClaimRead("other", "/c/a.pt", "c:1"), "c:1");
  EXPECT_EQ(cache_.storage_access()->ClaimRead("job", "/c/a.pt", "b:1"), "c:1");  // the first node that asked reads it
  clock_.Advance(std::chrono::minutes(10) - std::chrono::milliseconds(1));
  EXPECT_EQ(cache_.storage_access()->ClaimRead("job", "/c/a.pt", "b:1"), "c:1");
  EXPECT_EQ(cache_.storage_access()->DropClaims("job", "b:1"), 0u);
  EXPECT_EQ(cache_.storage_access()->DropClaims("job", "c:1"), 2u);  // c stopped answering: its claims on the job's files go
  EXPECT_EQ(cache_.storage_access()->ClaimRead("job", "/c/a.pt", "b:1"), "b:1");
  EXPECT_EQ(cache_.storage_access()->ClaimRead("job", "/c/b.pt", "a:1"), "a:1");
  EXPECT_EQ(cache_.storage_access()->ClaimRead("other", "/c/a.pt", "b:1"), "c:1");  // another job's stay
  clock_.Advance(std::chrono::milliseconds(1));
  EXPECT_EQ(cache_.storage_access()->ClaimRead("other", "/c/a.pt", "b:1"), "b:1");  // ten minutes: the claim lapsed
}

TEST_F(CacheAccessTest, AnotherUidCannotReadRemoveOverwriteOrWaitForAJobsFiles) {
  Save(alice_, "/c/a.pt", 1000);
  FileInfo f;
  uint64_t lease = 0;
  std::vector<uint64_t> unmap;
  const std::string owner = ": job 'job' belongs to uid 1001";
  Status s = cache_.Lookup(bob_, "job", "/c/a.pt", true, &f, &lease, &unmap);
  EXPECT_EQ(s.code(), Status::Code::kPermissionDenied);
  EXPECT_EQ(s.message(), "uid 1002 may not read /c/a.pt of job 'job'" + owner);
  s = cache_.Remove(bob_, "job", "/c/a.pt", &f);
  EXPECT_EQ(s.message(), "uid 1002 may not remove /c/a.pt of job 'job'" + owner);
  Alloc(bob_, "/c/a.pt", 1000, &s);
  EXPECT_EQ(s.message(), "uid 1002 may not write /c/a.pt in job 'job'" + owner);
  Alloc(bob_, "/c/new.pt", 1000, &s);  // a new path of the same job, too
  EXPECT_EQ(s.code(), Status::Code::kPermissionDenied);
  std::vector<FileInfo> waited;
  s = cache_.Wait(bob_, "job", {"/c/a.pt"}, std::chrono::milliseconds(1), &waited);
  EXPECT_EQ(s.code(), Status::Code::kPermissionDenied);
  // Nothing of it changed: alice still reads her file.
  ASSERT_TRUE(cache_.Lookup(alice_, "job", "/c/a.pt", false, &f, &lease, &unmap).ok());
  EXPECT_EQ(f.owner_uid, 1001u);
  EXPECT_EQ(f.size, 1000u);
}

TEST_F(CacheAccessTest, TagsAndRingsBelongToTheJobsOwner) {
  Save(alice_, "/c/a.pt", 1000);
  TagInfo out;
  Status s = cache_.CommitTag(bob_, Tag("t", {{0, "/c/a.pt", 1000}}), &out);
  EXPECT_EQ(s.message(), "uid 1002 may not commit tag 't' into job 'job': job 'job' belongs to uid 1001");
  std::vector<TagInfo> tags;
  s = cache_.ListTags(bob_, "job", &tags);
  EXPECT_EQ(s.message(), "uid 1002 may not list the tags of job 'job': job 'job' belongs to uid 1001");
  ASSERT_TRUE(cache_.CommitTag(alice_, Tag("t", {{0, "/c/a.pt", 1000}}), &out).ok());
  ASSERT_TRUE(cache_.ListTags(alice_, "job", &tags).ok());
  EXPECT_EQ(tags.size(), 1u);
  // A tag names files its job holds: a job nobody owns holds none, and a
  // refused tag claims nothing.
  TagInfo first = Tag("t", {{0, "/c/b.pt", 1}});
  first.job = "bobs";
  s = cache_.CommitTag(bob_, first, &out);
  EXPECT_EQ(s.code(), Status::Code::kNotFound);
  EXPECT_EQ(s.message(), "tag 't' names no file job 'bobs' holds on this server: a tag is recorded on a node "
                         "that saved files of it");
  uid_t owner = 0;
  EXPECT_FALSE(cache_.rings()->JobUid("bobs", &owner));
  Save(bob_, "/c/b.pt", 1, "bobs");
  ASSERT_TRUE(cache_.CommitTag(bob_, first, &out).ok());
  AllocateResult a;
  s = cache_.Allocate({alice_, "bobs", "t", "/c/b2.pt", 0, 100}, &a);
  EXPECT_EQ(s.message(), "uid 1001 may not write /c/b2.pt in job 'bobs': job 'bobs' belongs to uid 1002");
  std::string successor;
  s = cache_.rings()->SetRing(alice_, "bobs", 0, {"h:1"}, &successor);
  EXPECT_EQ(s.message(), "uid 1001 may not set the ring of job 'bobs': job 'bobs' belongs to uid 1002");
}

TEST_F(CacheAccessTest, ListShowsANonRootCallerOnlyItsOwnJobs) {
  Save(alice_, "/c/a.pt", 1000);
  AllocateResult b;
  ASSERT_TRUE(cache_.Allocate({bob_, "bobs", "t", "/c/b.pt", 0, 100}, &b).ok());  // PENDING counts
  std::vector<FileInfo> seen;
  ASSERT_TRUE(cache_.List(alice_, "", "", &seen).ok());
  ASSERT_EQ(seen.size(), 1u);
  EXPECT_EQ(seen[0].path, "/c/a.pt");
  ASSERT_TRUE(cache_.List(bob_, "job", "", &seen).ok());
  EXPECT_TRUE(seen.empty());
  ASSERT_TRUE(cache_.List(root_, "", "", &seen).ok());
  EXPECT_EQ(seen.size(), 2u);
  EXPECT_EQ(cache_.List("stolen", "", "", &seen).code(), Status::Code::kUnauthenticated);
}

TEST_F(CacheAccessTest, RootIsAnAdministrator) {
  bool admin = false;
  EXPECT_TRUE(RootLooksUpAlicesFile(&admin).ok());
  EXPECT_TRUE(admin);
}

class NoRootAdminTest : public CacheAccessTest {
 protected:
  NoRootAdminTest() : CacheAccessTest(SessionLimits{/*root_is_admin=*/false, 4096}) {}
};

TEST_F(NoRootAdminTest, RootIsNoAdministratorWhenTurnedOff) {
  bool admin = true;
  EXPECT_EQ(RootLooksUpAlicesFile(&admin).code(), Status::Code::kPermissionDenied);
  EXPECT_FALSE(admin);
}

TEST_F(CacheAccessTest, AFreeBufferIsNeverHandedToAnotherUid) {
  AllocateResult a = Alloc(alice_, "/c/a.pt", 1000);
  int fd = Fd(alice_, a.buffer_id);
  close(fd);
  ASSERT_TRUE(cache_.Abort(alice_, a.allocation_id).ok());  // the buffer is free again
  AllocateResult b;
  ASSERT_TRUE(cache_.Allocate({bob_, "bobs", "t", "/c/b.pt", 0, 1000}, &b).ok());
  EXPECT_NE(b.buffer_id, a.buffer_id);  // a new (zero-filled) buffer
  ASSERT_TRUE(cache_.Abort(bob_, b.allocation_id).ok());
  AllocateResult again = Alloc(alice_, "/c/a.pt", 1000);
  EXPECT_EQ(again.buffer_id, a.buffer_id);  // reused for its own uid
}

class TwoLeasesTest : public CacheAccessTest {
 protected:
  TwoLeasesTest() : CacheAccessTest(SessionLimits{/*root_is_admin=*/true, /*max_leases_per_session=*/2}) {}
};

TEST_F(TwoLeasesTest, LeasesPerSessionAreCapped) {
  Save(alice_, "/c/a.pt", 1000);
  FileInfo f;
  uint64_t l1 = 0, l2 = 0, l3 = 0;
  std::vector<uint64_t> unmap;
  ASSERT_TRUE(cache_.Lookup(alice_, "job", "/c/a.pt", true, &f, &l1, &unmap).ok());
  ASSERT_TRUE(cache_.Lookup(alice_, "job", "/c/a.pt", true, &f, &l2, &unmap).ok());
  Status s = cache_.Lookup(alice_, "job", "/c/a.pt", true, &f, &l3, &unmap);
  EXPECT_EQ(s.code(), Status::Code::kResourceExhausted);
  EXPECT_EQ(s.message(), "this session holds 2 leases (max_leases_per_session=2): release loaded "
                         "files before loading more");
  EXPECT_TRUE(cache_.Lookup(alice_, "job", "/c/a.pt", false, &f, &l3, &unmap).ok());  // no lease: fine
  ASSERT_TRUE(cache_.Release(alice_, {l1}, {}).ok());
  EXPECT_TRUE(cache_.Lookup(alice_, "job", "/c/a.pt", true, &f, &l3, &unmap).ok());
}

TEST_F(CacheAccessTest, IdleMeansNoRequestNoLeaseAndNoPendingAllocation) {
  Save(alice_, "/c/a.pt", 1000);
  FileInfo f;
  uint64_t lease = 0;
  std::vector<uint64_t> unmap;
  ASSERT_TRUE(cache_.Lookup(alice_, "job", "/c/a.pt", true, &f, &lease, &unmap).ok());
  AllocateResult pending;
  ASSERT_TRUE(cache_.Allocate({bob_, "bobs", "t", "/c/b.pt", 0, 100}, &pending).ok());
  clock_.Advance(std::chrono::milliseconds(9));
  EXPECT_TRUE(cache_.sessions()->IdleSessions(std::chrono::milliseconds(10)).empty());  // used 9 ms ago
  clock_.Advance(std::chrono::milliseconds(1));
  std::vector<std::string> idle = cache_.sessions()->IdleSessions(std::chrono::milliseconds(10));
  EXPECT_EQ(idle, std::vector<std::string>{root_});  // alice leases, bob writes
  EXPECT_TRUE(cache_.sessions()->IdleSessions(std::chrono::seconds(60)).empty());
  ASSERT_TRUE(cache_.Release(alice_, {lease}, {}).ok());
  ASSERT_TRUE(cache_.Abort(bob_, pending.allocation_id).ok());
  EXPECT_EQ(cache_.sessions()->IdleSessions(std::chrono::milliseconds(10)), std::vector<std::string>{root_});  // just used
  clock_.Advance(std::chrono::milliseconds(10));
  EXPECT_EQ(cache_.sessions()->IdleSessions(std::chrono::milliseconds(10)).size(), 3u);
}

}  // namespace
}  // namespace tce
