// The published versions of a job other nodes follow (cache/cache_follow.cc,
// read_grants, weight_files): the source's side of a following node's
// questions, and the following node's versions and replicas.
#include <gtest/gtest.h>
#include <unistd.h>

#include "cache/cache.h"
#include "cache/tag_registry.h"
#include "cache/versions_fixture.h"
#include "cache/weight_files.h"

namespace tce {
namespace {
using namespace versions_testing;

// The source's side of a follower's questions, and the follower's replicas.
class FollowTest : public VersionsTest {
 protected:
  // A buffer of the cache with `bytes` in it, as a follower's transfer fills one.
  std::unique_ptr<Buffer> Filled(const std::string& bytes) {
    std::unique_ptr<Buffer> mem;
    EXPECT_TRUE(cache_.recovery()->ReserveRecovery(bytes.size(), &mem).ok());
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
  Status s = cache_.publication()->PeerGetVersion("job", 0, 0, now, granted, &t, &nodes);
  EXPECT_EQ(s.code(), Status::Code::kPermissionDenied);
  EXPECT_EQ(s.message(), "node 10.0.0.2:7070 may not follow job 'job' here: no read grant for node 10.0.0.2:7070");
  EXPECT_EQ(s.message().find(std::to_string(kOwner)), std::string::npos) << "a peer is not told whose the job is";
  ReadGrants::Ids ids{{}, {}, {granted}};
  ASSERT_TRUE(cache_.publication()->GrantRead(owner_, "job", &ids, false).ok());
  EXPECT_EQ(ids.nodes, std::set<std::string>{granted});
  ASSERT_TRUE(cache_.publication()->PeerGetVersion("job", 0, 0, now, granted, &t, &nodes).ok());
  EXPECT_EQ(t.version, 1u);
  EXPECT_EQ(nodes, std::vector<std::string>{granted});
  EXPECT_EQ(cache_.publication()->PeerGetVersion("job", 0, 0, now, other, &t, &nodes).code(), Status::Code::kPermissionDenied);
  EXPECT_EQ(cache_.publication()->PeerGetVersion("job", 1, 0, now, granted, &t, &nodes).code(), Status::Code::kDeadlineExceeded);
  EXPECT_EQ(cache_.publication()->PeerGetVersion("job", 1, t.epoch, now, granted, &t, &nodes).code(),
            Status::Code::kDeadlineExceeded);
  ASSERT_TRUE(cache_.publication()->PeerGetVersion("job", 5, t.epoch + 1, now, granted, &t, &nodes).ok())
      << "a version above 5 of another numbering: any version here is newer";
  EXPECT_EQ(t.version, 1u);
  EXPECT_EQ(cache_.publication()->PeerGetVersion("nojob", 0, 0, now, granted, &t, &nodes).code(), Status::Code::kNotFound);
  EXPECT_TRUE(cache_.publication()->CheckPeerVersionRead("job", "s1", "/c/m.pt", granted).ok());
  EXPECT_EQ(cache_.publication()->CheckPeerVersionRead("job", "s1", "/c/other.pt", granted).message(),
            "/c/other.pt is not a file of version 1 (s1) of job 'job' here");
  EXPECT_EQ(cache_.publication()->CheckPeerVersionRead("job", "s1", "/c/m.pt", other).code(), Status::Code::kPermissionDenied);
  ASSERT_TRUE(cache_.publication()->GrantRead(owner_, "job", &ids, /*revoke=*/true).ok());
  s = cache_.publication()->CheckPeerVersionRead("job", "s1", "/c/m.pt", granted);
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
  ASSERT_TRUE(cache_.publication()->GrantRead(owner_, "job", &ids, false).ok());
  TagInfo t;
  std::vector<std::string> nodes;
  ASSERT_TRUE(cache_.publication()->PeerGetVersion("job", 0, 0, std::chrono::milliseconds(0), node, &t, &nodes).ok());
  ASSERT_EQ(t.files.size(), 1u);
  EXPECT_EQ(t.files[0].path, "/c/mp_rank_00_model_states.pt");
  EXPECT_TRUE(cache_.publication()->CheckPeerVersionRead("job", "s1", "/c/mp_rank_00_model_states.pt", node).ok());
  Status s = cache_.publication()->CheckPeerVersionRead("job", "s1", "/c/zero_pp_rank_0_mp_rank_00_optim_states.pt", node);
  EXPECT_EQ(s.code(), Status::Code::kPermissionDenied);
  EXPECT_EQ(s.message(), "/c/zero_pp_rank_0_mp_rank_00_optim_states.pt is no weight file of job 'job': optimizer, "
                         "scheduler and RNG states are not given to following nodes");
}

TEST_F(FollowTest, AFollowedJobKeepsItsSourcesEpochAndRefusesAbsurdJumps) {
  ASSERT_TRUE(cache_.publication()->AddFollower("fj", kOwner, kReader).ok());
  auto version = [](const std::string& tag, uint64_t v, uint64_t epoch) {
    TagInfo t = Tag("fj", tag, {{0, "/c/" + tag + ".safetensors", 5}});
    t.complete_unix_ns = static_cast<int64_t>(v) * 100 + static_cast<int64_t>(epoch), t.version = v, t.epoch = epoch;
    return t;
  };
  for (uint64_t v : {1, 2, 3}) ASSERT_TRUE(cache_.replicas()->AdoptFollowed(version("s" + std::to_string(v), v, 7)).ok());
  EXPECT_EQ(cache_.replicas()->AdoptFollowed(version("noepoch", 4, 0)).code(), Status::Code::kDataLoss);
  // A forged number far above the newest would leave every real one unseen.
  const uint64_t forged = 3 + TagRegistry::kMaxVersionJump + 1;
  Status s = cache_.replicas()->AdoptFollowed(version("forged", forged, 7));
  EXPECT_EQ(s.code(), Status::Code::kDataLoss);
  EXPECT_EQ(s.message(), "the source's version of job 'fj': version " + std::to_string(forged) +
                             " is more than 1048576 above 3, the newest here of its numbering (epoch 7)");
  ASSERT_TRUE(cache_.replicas()->AdoptFollowed(version("s4", 4, 7)).ok());
  const std::string reader = cache_.sessions()->OpenSession(kReader, 9, kReader);
  TagInfo got;
  ASSERT_TRUE(cache_.publication()->GetVersion(reader, "fj", 0, std::chrono::milliseconds(0), kNoDeadline, &got).ok());
  EXPECT_EQ(got.version, 4u);
  // The source lost its state and numbers from 1 again, in a new epoch: a
  // reader that saw version 4 is given version 1 of it.
  EXPECT_EQ(cache_.replicas()->AdoptFollowed(version("r0", TagRegistry::kMaxVersionJump + 1, 9)).code(),
            Status::Code::kDataLoss);
  ASSERT_TRUE(cache_.replicas()->AdoptFollowed(version("r1", 1, 9)).ok());
  ASSERT_TRUE(cache_.publication()->GetVersion(reader, "fj", 4, std::chrono::milliseconds(0), kNoDeadline, &got).ok());
  EXPECT_EQ(std::make_pair(got.tag, got.version), std::make_pair(std::string("r1"), uint64_t{1}));
  EXPECT_EQ(cache_.publication()->GetVersion(reader, "fj", 1, std::chrono::milliseconds(0), kNoDeadline, &got).code(),
            Status::Code::kNotFound);
  ASSERT_TRUE(cache_.replicas()->AdoptFollowed(version("r2", 2, 9)).ok());
  ASSERT_TRUE(cache_.publication()->GetVersion(reader, "fj", 1, std::chrono::milliseconds(0), kNoDeadline, &got).ok());
  EXPECT_EQ(got.version, 2u);
  EXPECT_FALSE(cache_.replicas()->VersionTag("fj", "s3", &got)) << "the old numbering's versions are gone";
}

TEST_F(FollowTest, AVersionsDigestsAreThoseItsPublisherComputesOfItsOwnFiles) {
  Save("s1", "/c/m.safetensors", 4096);
  TagInfo t = Tag("job", "s1", {{0, "/c/m.safetensors", 4096}, {1, "/c/elsewhere.safetensors", 10}});
  t.world_size = 2;  // rank 1's file: another node's
  for (TagFile& f : t.files) f.crc32 = 1234, f.has_crc32 = true;  // a client's word: not a digest
  TagInfo out;
  ASSERT_TRUE(cache_.CommitTag(owner_, t, &out).ok());
  EXPECT_FALSE(out.files[0].has_crc32 || out.files[1].has_crc32);
  std::vector<PeerVersions::DigestPin> pins;
  cache_.replicas()->VersionDigests(&out, &pins);
  ASSERT_EQ(pins.size(), 1u) << "this node's own file in memory only";
  EXPECT_EQ(out.files[pins[0].file].path, "/c/m.safetensors");
  close(pins[0].fd);
  cache_.recovery()->EndPeerRead(pins[0].buffer_id);
  out.files[pins[0].file].crc32 = 42, out.files[pins[0].file].has_crc32 = true;
  cache_.replicas()->RecordDigests(out);
  TagInfo again;
  ASSERT_TRUE(cache_.replicas()->VersionTag("job", "s1", &again));
  cache_.replicas()->VersionDigests(&again, &pins);
  EXPECT_TRUE(pins.empty()) << "computed once";
  ASSERT_EQ(again.files[0].path, "/c/m.safetensors");  // sorted by (rank, path)
  EXPECT_TRUE(again.files[0].has_crc32);
  EXPECT_EQ(again.files[0].crc32, 42u);
  EXPECT_FALSE(again.files[1].has_crc32) << "not held here";
  // A followed version keeps its source's digests; a replica is never digested here.
  ASSERT_TRUE(cache_.publication()->AddFollower("fj", kOwner, kReader).ok());
  TagInfo v = Tag("fj", "step1", {{0, "/c/w.safetensors", 5}, {0, "/c/x.safetensors", 5}});
  v.complete_unix_ns = 1, v.version = 1, v.epoch = 3, v.files[0].crc32 = 99, v.files[0].has_crc32 = true;
  ASSERT_TRUE(cache_.replicas()->AdoptFollowed(v).ok());
  FileInfo f;
  f.job = "fj", f.path = "/c/x.safetensors", f.size = 5;
  ASSERT_TRUE(cache_.replicas()->AdoptReplica(f, 1, Filled("hello")).ok());
  TagInfo followed;
  ASSERT_TRUE(cache_.replicas()->VersionTag("fj", "step1", &followed));
  cache_.replicas()->VersionDigests(&followed, &pins);
  EXPECT_TRUE(pins.empty());
  EXPECT_EQ(followed.files[0].crc32, 99u);
  EXPECT_FALSE(followed.files[1].has_crc32);
}

TEST_F(FollowTest, AFollowedJobIsThisServersAndItsFollowersRead) {
  constexpr uid_t kServer = 500;
  TagInfo v1 = Tag("fj", "step1", {{0, "/c/w.safetensors", 5}});
  v1.complete_unix_ns = 100, v1.version = 1, v1.epoch = 7;
  EXPECT_EQ(cache_.replicas()->AdoptFollowed(v1).code(), Status::Code::kFailedPrecondition) << "not followed here";
  ASSERT_TRUE(cache_.publication()->AddFollower("fj", kServer, kReader).ok());
  ASSERT_TRUE(cache_.replicas()->AdoptFollowed(v1).ok());
  uid_t owner = 0;
  ASSERT_TRUE(cache_.rings()->JobUid("fj", &owner));
  EXPECT_EQ(owner, kServer) << "never a uid a source names";
  TagInfo got;
  const std::string reader = cache_.sessions()->OpenSession(kReader, 9, kReader);
  EXPECT_TRUE(cache_.publication()->GetVersion(reader, "fj", 0, std::chrono::milliseconds(0), kNoDeadline, &got).ok());
  const std::string stranger = cache_.sessions()->OpenSession(kStranger, 10, kStranger);
  EXPECT_EQ(cache_.publication()->GetVersion(stranger, "fj", 0, std::chrono::milliseconds(0), kNoDeadline, &got).code(),
            Status::Code::kPermissionDenied);
  AllocateResult a;
  EXPECT_EQ(cache_.Allocate({reader, "fj", "t", "/c/x.pt", 0, 10}, &a).code(), Status::Code::kPermissionDenied)
      << "a follower reads the versions, nothing else";
  // A local user's job of that name is not followed over.
  Save("s1", "/c/m.pt", 4096);
  Status s = cache_.publication()->AddFollower("job", kServer, kReader);
  EXPECT_EQ(s.code(), Status::Code::kFailedPrecondition);
  EXPECT_EQ(s.message(), "job 'job' belongs to uid 1000 here: a followed job is this server's own (uid 500), so "
                         "it cannot follow a job of that name");
}

TEST_F(FollowTest, AFollowedVersionsReplicaServesThatVersionOnly) {
  // This cache follows "fj", owned by kOwner at the source; kReader reads.
  TagInfo v1 = Tag("fj", "step1", {{0, "/c/w.safetensors", 5}});
  v1.complete_unix_ns = 100, v1.version = 1, v1.epoch = 7;
  ASSERT_TRUE(cache_.publication()->AddFollower("fj", kOwner, kReader).ok());
  ASSERT_TRUE(cache_.replicas()->AdoptFollowed(v1).ok());
  std::string reader = cache_.sessions()->OpenSession(kReader, 9, kReader);
  TagInfo got;
  ASSERT_TRUE(cache_.publication()->GetVersion(reader, "fj", 0, std::chrono::milliseconds(0), kNoDeadline, &got).ok());
  EXPECT_EQ(got.version, 1u);
  EXPECT_FALSE(cache_.replicas()->HoldsInMemory("fj", "/c/w.safetensors", "step1"));
  FileInfo f;
  f.job = "fj", f.path = "/c/w.safetensors", f.size = 5;
  ASSERT_TRUE(cache_.replicas()->AdoptReplica(f, 1, Filled("hello")).ok());
  EXPECT_TRUE(cache_.replicas()->HoldsInMemory("fj", "/c/w.safetensors", "step1"));
  EXPECT_EQ(cache_.Stats().replica_files, 1u);
  VersionGrant g;
  ASSERT_TRUE(cache_.publication()->AcquireVersion(reader, "fj", 1, std::chrono::milliseconds(0), &g).ok());
  ASSERT_NE(g.files[0].buffer_id, 0u);
  ASSERT_TRUE(cache_.publication()->ReleaseVersion(reader, g.lease_id).ok());
  // Version 2 names the same path: the replica is version 1's, not its.
  TagInfo v2 = Tag("fj", "step2", {{0, "/c/w.safetensors", 5}});
  v2.complete_unix_ns = 200, v2.version = 2, v2.epoch = 7;
  ASSERT_TRUE(cache_.replicas()->AdoptFollowed(v2).ok());
  EXPECT_FALSE(cache_.replicas()->HoldsInMemory("fj", "/c/w.safetensors", "step2"));
  ASSERT_TRUE(cache_.publication()->AcquireVersion(reader, "fj", 2, std::chrono::milliseconds(0), &g).ok());
  EXPECT_EQ(g.files[0].buffer_id, 0u);
  FileInfo out;
  int fd = -1;
  EXPECT_EQ(cache_.replicas()->StartVersionRead("fj", "/c/w.safetensors", "step2", &out, &fd).code(),
            Status::Code::kNotFound);
  ASSERT_TRUE(cache_.replicas()->StartVersionRead("fj", "/c/w.safetensors", "step1", &out, &fd).ok());
  close(fd);
  cache_.recovery()->EndPeerRead(out.buffer_id);
  // A replica of a size the version does not list, or of a version not
  // here, is refused.
  f.size = 6;
  EXPECT_EQ(cache_.replicas()->AdoptReplica(f, 2, Filled("hello!")).code(), Status::Code::kInvalidArgument);
  f.size = 5;
  EXPECT_EQ(cache_.replicas()->AdoptReplica(f, 7, Filled("hello")).code(), Status::Code::kNotFound);
  // The replica of version 1 is free once version 2's is adopted; version
  // 3's reuses its buffer (same id), and a reader keeping it mapped stays.
  ASSERT_TRUE(cache_.publication()->ReleaseVersion(reader, g.lease_id).ok());
  std::unique_ptr<Buffer> mem2 = Filled("world");
  f.size = 5;
  ASSERT_TRUE(cache_.replicas()->AdoptReplica(f, 2, std::move(mem2)).ok());
  TagInfo v3 = Tag("fj", "step3", {{0, "/c/w.safetensors", 5}});
  v3.complete_unix_ns = 300, v3.version = 3, v3.epoch = 7;
  ASSERT_TRUE(cache_.replicas()->AdoptFollowed(v3).ok());
  const uint64_t reused_before = cache_.Stats().buffers_reused;
  std::unique_ptr<Buffer> mem3;
  ASSERT_TRUE(cache_.replicas()->ReserveReplica("fj", 5, &mem3).ok());
  EXPECT_EQ(mem3->id(), out.buffer_id) << "version 1's replica buffer, free again";
  EXPECT_EQ(cache_.Stats().buffers_reused, reused_before + 1);
  ASSERT_EQ(pwrite(mem3->fd(), "third", 5, 0), 5);
  ASSERT_TRUE(cache_.replicas()->AdoptReplica(f, 3, std::move(mem3)).ok());
  EXPECT_TRUE(cache_.replicas()->HoldsInMemory("fj", "/c/w.safetensors", "step3"));
}

}  // namespace
}  // namespace tce
