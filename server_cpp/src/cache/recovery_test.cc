// The Recovery component (cache/recovery.h) on a real Cache: what the ring
// brings back is checked before it is adopted, a reserved buffer counts
// against the budget until it is adopted or abandoned, and a peer's read
// pins its buffer until EndPeerRead.
#include "cache/recovery.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <memory>
#include <string>
#include <utility>

#include "cache/cache_fixture.h"

namespace tce {
namespace {
using namespace cache_testing;

class RecoveryTest : public CacheTest {
 protected:
  RecoveryTest() : CacheTest(8 * kMiB) {}

  Recovery* recovery() { return cache_.recovery(); }
  // A buffer reserved for a recovered file, `size` bytes written into it.
  std::unique_ptr<Buffer> Reserved(uint64_t size) {
    std::unique_ptr<Buffer> mem;
    Status s = recovery()->ReserveRecovery(size, &mem);
    EXPECT_TRUE(s.ok()) << s.ToString();
    if (!mem) return mem;
    const std::string bytes(size, 'r');
    EXPECT_EQ(pwrite(mem->fd(), bytes.data(), bytes.size(), 0), static_cast<ssize_t>(bytes.size()));
    return mem;
  }
  // A copy of (job, path) as the ring hands it back.
  static FileInfo Copy(const std::string& path, uint64_t size, std::vector<Record> records = {}) {
    FileInfo f;
    f.job = "job";
    f.tag = "t1";
    f.path = path;
    f.size = size;
    f.records = std::move(records);
    f.backup_holder = "10.0.0.2:7070";
    return f;
  }
  // Metadata knew (job, path) before the restart, at `size`, with `records`
  // (in memory only: lost with the restart, for the ring to give back).
  void Known(const std::string& path, uint64_t size, std::vector<Record> records) {
    FileInfo f = Copy(path, size, std::move(records));
    f.backup_holder.clear();
    f.state = FileState::kCached;  // not persisted: FAILED as lost, to be recovered
    f.owner_uid = getuid();
    f.owner_gid = getgid();
    f.version = 3;
    cache_.Restore({f});
  }
  static Record Rec(const std::string& name, uint64_t size, uint32_t crc) {
    Record r;
    r.name = name;
    r.size = size;
    r.crc32 = crc;
    return r;
  }
};

TEST_F(RecoveryTest, AdoptionRefusesACopyThatIsNotTheFileMetadataKnows) {
  Known("/c/a.pt", 4096, {Rec("data/0", 4000, 77)});
  ASSERT_EQ(recovery()->NotInMemory("job").size(), 1u);

  Status s = recovery()->AdoptRecovered(Copy("/c/a.pt", 100, {Rec("data/0", 4000, 77)}), Reserved(100));
  EXPECT_EQ(s.code(), Status::Code::kDataLoss);
  EXPECT_EQ(s.message(), "the ring's copy of /c/a.pt has 100 bytes, metadata 4096: storage serves it");
  s = recovery()->AdoptRecovered(Copy("/c/a.pt", 4096, {Rec("data/0", 4000, 78)}), Reserved(4096));
  EXPECT_EQ(s.code(), Status::Code::kDataLoss);
  EXPECT_EQ(s.message(),
            "the ring's copy of /c/a.pt does not match the checksums in metadata (record data/0): storage serves it");
  // Names a save could not have: refused before anything is looked up.
  s = recovery()->AdoptRecovered(Copy("/c/../a.pt", 4096), Reserved(4096));
  EXPECT_EQ(s.code(), Status::Code::kPermissionDenied);
  EXPECT_EQ(s.message(), "the ring's copy of /c/../a.pt is refused: path: has a '..' component: /c/../a.pt");
  // A file metadata does not know belongs to whoever set the job's ring here: nobody did.
  s = recovery()->AdoptRecovered(Copy("/c/b.pt", 10), Reserved(10));
  EXPECT_EQ(s.code(), Status::Code::kPermissionDenied);
  EXPECT_EQ(s.message(),
            "the ring's copy of /c/b.pt is refused: job job has no ring set here by its user: nothing is read "
            "from storage for it (its ring came from metadata, which does not know the file)");
  CacheStats st = cache_.Stats();
  EXPECT_EQ(st.ring_checksum_mismatches, 2u);
  EXPECT_EQ(st.recovered_files, 0u);
  EXPECT_EQ(recovery()->InMemoryCount("job"), 0u);

  // The copy metadata knows is adopted, BACKED_UP at its holder, with metadata's owner.
  ASSERT_TRUE(recovery()->AdoptRecovered(Copy("/c/a.pt", 4096, {Rec("data/0", 4000, 77)}), Reserved(4096)).ok());
  std::vector<FileInfo> listed = Files(cache_, "job", "");
  ASSERT_EQ(listed.size(), 1u);
  EXPECT_EQ(listed[0].state, FileState::kBackedUp);
  EXPECT_EQ(listed[0].backup_holder, "10.0.0.2:7070");
  EXPECT_EQ(listed[0].owner_uid, getuid());
  EXPECT_NE(listed[0].buffer_id, 0u);
  EXPECT_EQ(cache_.Stats().recovered_files, 1u);
  EXPECT_EQ(recovery()->InMemoryCount("job"), 1u);
  EXPECT_TRUE(recovery()->NotInMemory("job").empty());
  // A second copy of it does not replace the one in memory.
  s = recovery()->AdoptRecovered(Copy("/c/a.pt", 4096, {Rec("data/0", 4000, 77)}), Reserved(4096));
  EXPECT_EQ(s.code(), Status::Code::kFailedPrecondition);
  EXPECT_EQ(s.message(), "/c/a.pt was saved again meanwhile: the newer copy stays");
  EXPECT_EQ(recovery()->Figures().reserved_buffers, 0u) << "every reservation settled, adopted or refused";
  EXPECT_EQ(cache_.Stats().used, listed[0].capacity) << "the refused copies' buffers left the budget";
}

TEST_F(RecoveryTest, ARecoveredTagMustAgreeWithTheFilesBroughtBack) {
  Known("/c/a.pt", 4096, {});
  ASSERT_TRUE(recovery()->AdoptRecovered(Copy("/c/a.pt", 4096), Reserved(4096)).ok());
  TagInfo t = Tag("t1", {{0, "/c/a.pt", 4096}, {1, "/c/b.pt", 10}});
  EXPECT_TRUE(recovery()->CheckRecoveredTag(t, {"/c/a.pt"}).ok()) << "b is another node's, memory only";
  Status s = recovery()->CheckRecoveredTag(t, {"/c/a.pt", "/c/b.pt"});
  EXPECT_EQ(s.code(), Status::Code::kFailedPrecondition);
  EXPECT_EQ(s.message(), "tag t1 names /c/b.pt (10 bytes), which the ring listed as this node's but did not give back");
  t.files[0].size = 4000;
  EXPECT_EQ(recovery()->CheckRecoveredTag(t, {"/c/a.pt"}).message(),
            "tag t1 names /c/a.pt (4000 bytes), which the ring listed as this node's but did not give back");
}

TEST_F(RecoveryTest, AReservedBufferCountsAgainstTheBudgetUntilAbandoned) {
  std::unique_ptr<Buffer> first;
  ASSERT_TRUE(recovery()->ReserveRecovery(5 * kMiB, &first).ok());
  RecoveryFigures f = recovery()->Figures();
  EXPECT_EQ(f.reserved_buffers, 1u);
  EXPECT_EQ(f.reserved_bytes, first->capacity());
  std::unique_ptr<Buffer> second;
  Status s = recovery()->ReserveRecovery(5 * kMiB, &second);
  EXPECT_EQ(s.code(), Status::Code::kResourceExhausted) << "the first one's bytes are held: nothing to evict";
  EXPECT_FALSE(second);
  s = recovery()->ReserveRecovery(9 * kMiB, &second);
  EXPECT_EQ(s.message(), "a file of 9437184 bytes does not fit in the memory budget (8388608 bytes)");
  recovery()->AbandonRecovery(std::move(first));
  EXPECT_EQ(recovery()->Figures().reserved_buffers, 0u);
  EXPECT_EQ(recovery()->Figures().reserved_bytes, 0u);
  ASSERT_TRUE(recovery()->ReserveRecovery(5 * kMiB, &second).ok()) << "the abandoned bytes came back";
  recovery()->AbandonRecovery(std::move(second));
  recovery()->AbandonRecovery(nullptr);  // nothing to give back
  EXPECT_EQ(recovery()->Figures().reserved_buffers, 0u);
}

TEST_F(RecoveryTest, APeerReadPinsItsBufferUntilEndPeerRead) {
  const std::string s1 = cache_.sessions()->OpenSession(getuid(), getpid(), getgid());
  Save(s1, "/c/a.pt", 1 * kMiB);
  FileInfo f;
  int fd = -1;
  Status s = recovery()->StartPeerRead("job", "/c/missing.pt", &f, &fd);
  EXPECT_EQ(s.code(), Status::Code::kNotFound);
  EXPECT_EQ(s.message(), "/c/missing.pt is not in this server's memory");
  ASSERT_TRUE(recovery()->StartPeerRead("job", "/c/a.pt", &f, &fd).ok());
  EXPECT_GE(fd, 0);
  EXPECT_EQ(f.size, 1 * kMiB);
  close(fd);
  // Removed while read: the buffer stays the reader's, not free for reuse.
  FileInfo removed;
  ASSERT_TRUE(cache_.Remove(s1, "job", "/c/a.pt", &removed).ok());
  EXPECT_EQ(cache_.Stats().free, 0u);
  EXPECT_EQ(recovery()->InMemoryCount("job"), 0u);
  recovery()->EndPeerRead(f.buffer_id);
  EXPECT_EQ(cache_.Stats().free, f.capacity) << "free for reuse once the read ended";
  recovery()->EndPeerRead(f.buffer_id + 1000);  // a buffer that is no more: nothing
}

}  // namespace
}  // namespace tce
