// Replicas' own rules (cache/replicas.h), against a TagRegistry and a host
// that records what it is asked: a source's version is checked before the
// host sees it, digests come from the recorded version and only the node's
// own files are pinned for them, a read names a file of a recorded tag.
// The Cache's side (buffers, replicas, pins) is cache_follow_test.cc's.
#include "cache/replicas.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace tce {
namespace {

// Records each call; pins every file asked for (fd -1, buffer 100 + index).
class FakeHost : public ReplicaHost {
 public:
  Status LendBuffer(const std::string& job, uint64_t size, std::unique_ptr<Buffer>*) override {
    calls.push_back("lend " + job + " " + std::to_string(size));
    return Status::ResourceExhausted("no memory here");
  }
  void ReturnBuffer(std::unique_ptr<Buffer>) override { calls.push_back("return"); }
  Status RecordFollowed(TagInfo tag) override {
    calls.push_back("follow " + tag.job + " " + tag.tag);
    return Status::OK();
  }
  Status InstallReplica(FileInfo f, uint64_t tag_version, std::unique_ptr<Buffer>) override {
    calls.push_back("install " + f.path + " " + std::to_string(tag_version));
    return Status::OK();
  }
  Status PinVersionFile(const TagInfo& tag, const TagFile& tf, bool own_only, FileInfo* out, int* fd) override {
    calls.push_back(std::string(own_only ? "pin own " : "pin ") + tag.tag + " " + tf.path);
    out->path = tf.path;
    out->buffer_id = 100 + pinned++;
    *fd = -1;
    return Status::OK();
  }
  bool HoldsVersionFile(const std::string&, const std::string& path, const std::string& tag) override {
    calls.push_back("holds " + tag + " " + path);
    return true;
  }
  std::vector<std::string> calls;
  uint64_t pinned = 0;
};

TagInfo Version(const std::string& tag, uint64_t version, std::vector<std::string> paths) {
  TagInfo t;
  t.job = "job";
  t.tag = tag;
  t.world_size = 1;
  t.version = version;
  t.epoch = 7;
  t.complete_unix_ns = 100 * static_cast<int64_t>(version);
  for (const std::string& p : paths) t.files.push_back(TagFile{0, p, 5});
  return t;
}

class ReplicasTest : public ::testing::Test {
 protected:
  TagRegistry tags_;
  FakeHost host_;
  Replicas replicas_{&tags_, &host_};
};

TEST_F(ReplicasTest, ASourcesVersionIsCheckedBeforeTheCacheSeesIt) {
  TagInfo bad_job = Version("s1", 1, {"/c/w.safetensors"});
  bad_job.job = "";
  EXPECT_EQ(replicas_.AdoptFollowed(bad_job).code(), Status::Code::kInvalidArgument);
  TagInfo no_files = Version("s1", 1, {});
  no_files.world_size = 0;
  Status s = replicas_.AdoptFollowed(no_files);
  EXPECT_EQ(s.code(), Status::Code::kInvalidArgument);
  EXPECT_EQ(s.message().rfind("the source's version: ", 0), 0u) << s.message();
  s = replicas_.AdoptFollowed(Version("s1", 0, {"/c/w.safetensors"}));
  EXPECT_EQ(s.code(), Status::Code::kInvalidArgument);
  EXPECT_EQ(s.message(), "the source's tag s1 has no version");
  EXPECT_TRUE(host_.calls.empty()) << "nothing a source says wrongly reaches the cache";
  ASSERT_TRUE(replicas_.AdoptFollowed(Version("s1", 1, {"/c/w.safetensors"})).ok());
  EXPECT_EQ(host_.calls, std::vector<std::string>{"follow job s1"});
}

TEST_F(ReplicasTest, DigestsAreTheRecordedVersionsAndOnlyOwnFilesArePinned) {
  TagInfo recorded;
  ASSERT_TRUE(tags_.Adopt(Version("s1", 1, {"/c/a.safetensors", "/c/b.safetensors"})));
  ASSERT_TRUE(tags_.Find("job", "s1", &recorded));
  tags_.SetDigests("job", "s1", recorded.version, {{"/c/a.safetensors", 42}});
  // Another version of the tag than the one recorded: no digest, no pin.
  TagInfo stale = recorded;
  stale.version = recorded.version + 1;
  std::vector<PeerVersions::DigestPin> pins{{9, 9, 9}};
  replicas_.VersionDigests(&stale, &pins);
  EXPECT_TRUE(pins.empty());
  EXPECT_FALSE(stale.files[0].has_crc32);
  EXPECT_TRUE(host_.calls.empty());
  // The recorded version: a's digest as recorded, b pinned (own files only) to be digested.
  TagInfo asked = recorded;
  asked.files.push_back(TagFile{0, "/c/unlisted.safetensors", 5});  // not the version's: skipped
  replicas_.VersionDigests(&asked, &pins);
  EXPECT_TRUE(asked.files[0].has_crc32);
  EXPECT_EQ(asked.files[0].crc32, 42u);
  ASSERT_EQ(pins.size(), 1u);
  EXPECT_EQ(pins[0].file, 1u);
  EXPECT_EQ(pins[0].buffer_id, 100u);
  EXPECT_EQ(host_.calls, std::vector<std::string>{"pin own s1 /c/b.safetensors"});
  // What the node computed is recorded with that version.
  asked.files[1].crc32 = 7, asked.files[1].has_crc32 = true;
  replicas_.RecordDigests(asked);
  TagInfo again;
  ASSERT_TRUE(replicas_.VersionTag("job", "s1", &again));
  EXPECT_TRUE(again.files[1].has_crc32);
  EXPECT_EQ(again.files[1].crc32, 7u);
}

TEST_F(ReplicasTest, AReadNamesAFileOfARecordedTag) {
  ASSERT_TRUE(tags_.Adopt(Version("s1", 1, {"/c/w.safetensors"})));
  FileInfo out;
  int fd = -1;
  Status s = replicas_.StartVersionRead("job", "/c/w.safetensors", "s2", &out, &fd);
  EXPECT_EQ(s.code(), Status::Code::kNotFound);
  EXPECT_EQ(s.message(), "no tag s2 of job 'job' here");
  s = replicas_.StartVersionRead("job", "/c/x.safetensors", "s1", &out, &fd);
  EXPECT_EQ(s.code(), Status::Code::kNotFound);
  EXPECT_EQ(s.message(), "/c/x.safetensors of s1 is not in this server's memory");
  EXPECT_TRUE(host_.calls.empty());
  ASSERT_TRUE(replicas_.StartVersionRead("job", "/c/w.safetensors", "s1", &out, &fd).ok());
  EXPECT_EQ(host_.calls, std::vector<std::string>{"pin s1 /c/w.safetensors"}) << "the node's own, or a replica";
}

TEST_F(ReplicasTest, RangesServedAreCounted) {
  EXPECT_EQ(replicas_.ranges_served(), 0u);
  replicas_.NoteVersionRangeServed();
  replicas_.NoteVersionRangeServed();
  EXPECT_EQ(replicas_.ranges_served(), 2u);
}

}  // namespace
}  // namespace tce
