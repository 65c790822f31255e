// What a server holds for its peers: the BackupStore's copies (within a
// budget) and tags (per owner, bounded), the checks of a copy's records, and
// the PeerServer taking tags and a striped backup end to end.
#include <gtest/gtest.h>
#include <unistd.h>

#include <csignal>

#include "cache/cache.h"
#include "cache/tag_proto.h"
#include "common/manual_clock.h"
#include "common/testing.h"
#include "persist/crc.h"
#include "ring/backup_store.h"
#include "ring/peer_link.h"
#include "ring/peer_server.h"
#include "ring/peer_testing.h"
#include "ring/tcp_transport.h"
#include "tce/v1/tce.pb.h"

namespace tce {
namespace {
using namespace std::chrono_literals;

TEST(BackupStore, BudgetRecyclingAndDrop) {
  const uint64_t cap = Buffer::CapacityFor(1 << 20);
  BackupStore store(cap * 2);
  std::unique_ptr<MappedBuffer> a, b, c;
  ASSERT_TRUE(store.Reserve("j", "/a", 1 << 20, &a).ok());
  ASSERT_TRUE(store.Reserve("j", "/b", 1 << 20, &b).ok());
  Status full = store.Reserve("j", "/c", 1 << 20, &c);
  EXPECT_EQ(full.code(), Status::Code::kResourceExhausted);
  EXPECT_NE(full.message().find("backup share full"), std::string::npos);
  a->data()[5] = 42;  // the mapping is writable
  HeldBackup h;
  h.file.job = "j";
  h.file.path = "/a";
  h.file.size = 1 << 20;
  h.file.version = 3;
  h.buffer = std::move(a);
  store.Commit(std::move(h));
  store.Abandon(std::move(b));  // back to the free pool
  ASSERT_TRUE(store.Reserve("j", "/c", 1 << 20, &c).ok());  // recycles b: no new memory
  EXPECT_EQ(store.Stats().reused, 1u);
  EXPECT_EQ(store.Stats().used, cap * 2);
  store.Abandon(std::move(c));
  EXPECT_FALSE(store.Drop("j", "/a", 4));  // another version: kept
  EXPECT_TRUE(store.Drop("j", "/a", 3));
  BackupStoreStats st = store.Stats();
  EXPECT_EQ(st.files, 0u);
  EXPECT_EQ(st.used, cap * 2);  // both buffers wait in the pool
  // A copy too large for the pooled buffers: they are destroyed to make room.
  const uint64_t big_size = cap + cap / 2;
  ASSERT_LE(Buffer::CapacityFor(big_size), cap * 2);
  std::unique_ptr<MappedBuffer> big;
  ASSERT_TRUE(store.Reserve("j", "/big", big_size, &big).ok());
  EXPECT_EQ(store.Stats().used, Buffer::CapacityFor(big_size));
  store.Abandon(std::move(big));
}

TEST(CheckRanges, TileTheFileInBoundedRanges) {
  EXPECT_TRUE(CheckRanges(0).empty());
  for (uint64_t size : {uint64_t{1}, kCheckRange - 1, kCheckRange, kCheckRange + 1, 3 * kCheckRange + 7}) {
    std::vector<Record> r = CheckRanges(size);
    ASSERT_EQ(r.size(), (size + kCheckRange - 1) / kCheckRange) << size;
    uint64_t at = 0;
    for (const Record& x : r) {
      EXPECT_EQ(x.data_offset, at);
      EXPECT_GT(x.size, 0u);
      EXPECT_LE(x.size, kCheckRange);
      at += x.size;
    }
    EXPECT_EQ(at, size);
  }
}

TEST(VerifyRecords, NamesTheRecordThatDiffers) {
  std::vector<unsigned char> data(300, 'x');
  std::vector<Record> records = {{"a/data/0", 0, 10, 100, 0, 0}, {"a/data/1", 120, 130, 50, 0, 0}};
  for (Record& r : records) r.crc32 = Crc32(0, data.data() + r.data_offset, r.size);
  EXPECT_TRUE(VerifyRecords(data.data(), data.size(), records).ok());
  data[150] ^= 1;
  Status s = VerifyRecords(data.data(), data.size(), records);
  EXPECT_EQ(s.code(), Status::Code::kInternal);
  EXPECT_NE(s.message().find("checksum mismatch in record a/data/1"), std::string::npos) << s.message();
  records[1].size = 1000;
  EXPECT_EQ(VerifyRecords(data.data(), data.size(), records).code(), Status::Code::kInvalidArgument);
}

TagInfo HeldTagInfo(const std::string& job, const std::string& name, int64_t complete, size_t files,
                    size_t path_bytes = 16) {
  TagInfo t;
  t.job = job;
  t.tag = name;
  t.complete_unix_ns = complete;
  t.world_size = static_cast<int32_t>(files);
  for (size_t i = 0; i < files; ++i)
    t.files.push_back(TagFile{static_cast<int32_t>(i), "/" + std::string(path_bytes, 'p') + std::to_string(i), 1});
  return t;
}

TEST(BackupStore, HoldsTagsPerOwnerNewestWinsAndBounded) {
  BackupStore store(0);
  ASSERT_TRUE(store.HoldTag(HeldTag{HeldTagInfo("j", "s2", 200, 2), "a:1", 0}).ok());
  ASSERT_TRUE(store.HoldTag(HeldTag{HeldTagInfo("j", "s1", 100, 2), "a:1", 0}).ok());
  ASSERT_TRUE(store.HoldTag(HeldTag{HeldTagInfo("j", "s1", 50, 3), "a:1", 0}).ok());  // older: ignored
  ASSERT_TRUE(store.HoldTag(HeldTag{HeldTagInfo("j", "x", 10, 1), "b:1", 1}).ok());  // another owner
  std::vector<HeldTag> tags = store.Tags("j", 0);
  ASSERT_EQ(tags.size(), 2u);
  EXPECT_EQ(tags[0].tag.tag, "s1");  // oldest first
  EXPECT_EQ(tags[0].tag.files.size(), 2u);
  EXPECT_EQ(tags[1].tag.tag, "s2");
  EXPECT_EQ(tags[1].owner, "a:1");
  EXPECT_EQ(store.Tags("j", 1).size(), 1u);
  EXPECT_TRUE(store.Tags("j", 2).empty());
  EXPECT_EQ(store.Stats().tags, 3u);

  // One tag bigger than an owner's share is refused; many push out the oldest.
  const TagInfo huge = HeldTagInfo("j", "huge", 300, 4200, 4000);
  ASSERT_GT(BackupStore::TagBytes(huge), BackupStore::kMaxTagBytesPerOwner);
  EXPECT_EQ(store.HoldTag(HeldTag{huge, "a:1", 0}).code(), Status::Code::kResourceExhausted);
  const TagInfo big = HeldTagInfo("j", "big", 0, 1024, 4000);  // ~4 MiB
  const size_t fit = BackupStore::kMaxTagBytesPerOwner / BackupStore::TagBytes(big);
  for (size_t i = 0; i < fit + 2; ++i) {
    TagInfo t = big;
    t.tag = "big" + std::to_string(i);
    t.complete_unix_ns = 1000 + static_cast<int64_t>(i);
    ASSERT_TRUE(store.HoldTag(HeldTag{t, "a:1", 0}).ok());
  }
  tags = store.Tags("j", 0);
  ASSERT_EQ(tags.size(), fit);
  EXPECT_EQ(tags.front().tag.tag, "big2");  // s1, s2, big0 and big1 went
  EXPECT_EQ(tags.back().tag.tag, "big" + std::to_string(fit + 1));
  // Over all owners, the total is bounded too.
  Status s;
  for (int owner = 1; s.ok() && owner < 1000; ++owner) {
    for (size_t i = 0; s.ok() && i < fit; ++i) {
      TagInfo t = big;
      t.tag = "big" + std::to_string(i);
      s = store.HoldTag(HeldTag{t, "c:1", owner});
    }
  }
  EXPECT_EQ(s.code(), Status::Code::kResourceExhausted) << s.ToString();
  EXPECT_NE(s.message().find("the most a server holds for its peers"), std::string::npos) << s.message();
  EXPECT_LE((store.Stats().tags - 1) * BackupStore::TagBytes(big), BackupStore::kMaxTagBytes);  // all but "x" are big
}

// A peer's tags end to end: checked when they arrive, held, listed back to
// the peer that sent them, refused to another (this server knows no ring).
TEST(PeerServer, HoldsAPeersCheckedTagsAndListsThemBack) {
  signal(SIGPIPE, SIG_IGN);
  std::unique_ptr<Transport> transport = NewTcpTransport(1);
  BackupStore store(64 << 20);
  PeerServer server(LoopbackPeerOptions(), transport.get(), &store);
  ASSERT_TRUE(server.Start().ok());
  std::unique_ptr<PeerLink> link;
  ASSERT_TRUE(PeerLink::Connect(server.endpoint(), "127.0.0.1:1", "t", 2000ms, &link).ok());
  auto send = [&](const TagInfo& t, int32_t node) {
    v1::PeerRequest req;
    TagToProto(t, req.mutable_tag()->mutable_tag());
    req.mutable_tag()->set_owner_node(node);
    v1::PeerReply reply;
    EXPECT_TRUE(link->Send(req).ok());
    EXPECT_TRUE(link->Recv(&reply).ok());
    return reply;
  };
  EXPECT_EQ(send(HeldTagInfo("j", "step4", 400, 2), 0).code(), 0);
  TagInfo relative = HeldTagInfo("j", "bad", 500, 1);
  relative.files[0].path = "rel/x";
  v1::PeerReply r = send(relative, 0);
  EXPECT_EQ(r.code(), static_cast<int>(Status::Code::kInvalidArgument));
  EXPECT_NE(r.message().find("tag.files[0].path"), std::string::npos) << r.message();
  TagInfo outside = HeldTagInfo("j", "bad", 500, 1);
  outside.files[0].rank = 3;
  EXPECT_EQ(send(outside, 0).code(), static_cast<int>(Status::Code::kInvalidArgument));
  EXPECT_EQ(send(HeldTagInfo("j", "bad", 0, 1), 0).code(), static_cast<int>(Status::Code::kInvalidArgument));
  r = send(HeldTagInfo("j", "bad", 500, 1), -1);
  EXPECT_NE(r.message().find("owner_node -1 is outside a ring"), std::string::npos) << r.message();
  TagInfo nul = HeldTagInfo("j", "bad", 500, 1);
  nul.job = std::string("j\0x", 3);
  EXPECT_EQ(send(nul, 0).code(), static_cast<int>(Status::Code::kInvalidArgument));
  EXPECT_EQ(store.Stats().tags, 1u);  // only the good one

  v1::PeerRequest list;
  list.mutable_list()->set_job("j");
  list.mutable_list()->set_owner_node(0);
  list.mutable_list()->set_job_uid(0);  // the uid the tags were sent as (none named: 0)
  v1::PeerListReply got;
  ASSERT_TRUE(link->Send(list).ok());
  ASSERT_TRUE(link->Recv(&got).ok());
  EXPECT_EQ(got.code(), 0) << got.message();
  ASSERT_EQ(got.tags_size(), 1);
  EXPECT_EQ(got.tags(0).tag(), "step4");
  EXPECT_EQ(got.tags(0).complete_unix_ns(), 400);
  ASSERT_EQ(got.tags(0).files_size(), 2);
  EXPECT_EQ(got.tags(0).files(1).rank(), 1);

  std::unique_ptr<PeerLink> other;  // authenticated, but not who sent the tag
  ASSERT_TRUE(PeerLink::Connect(server.endpoint(), "127.0.0.1:6", "t", 2000ms, &other).ok());
  ASSERT_TRUE(other->Send(list).ok());
  ASSERT_TRUE(other->Recv(&got).ok());
  EXPECT_EQ(got.code(), static_cast<int>(Status::Code::kPermissionDenied));
  EXPECT_EQ(got.tags_size(), 0);
  server.Stop();
}

// Lanes end to end: OpenLanes against a real PeerServer, a striped backup
// it verifies and keeps, and lanes that cannot be bound are refused.
TEST(PeerServer, BindsLanesAndTakesAStripedBackup) {
  signal(SIGPIPE, SIG_IGN);
  std::unique_ptr<Transport> rx_transport = NewTcpTransport(4), tx_transport = NewTcpTransport(4);
  BackupStore store(64 << 20);
  ManualClock clock;  // the server's wait for lanes ends when the test says
  PeerServerOptions options = LoopbackPeerOptions();
  options.clock = &clock;
  PeerServer server(options, rx_transport.get(), &store);
  ASSERT_TRUE(server.Start().ok());
  std::unique_ptr<PeerLink> link;
  ASSERT_TRUE(PeerLink::Connect(server.endpoint(), "127.0.0.1:1", "t", 2000ms, &link).ok());
  Status s = OpenLanes(link.get(), server.endpoint(), "127.0.0.1:1", "t", 2000ms, 4);
  ASSERT_TRUE(s.ok()) << s.ToString();
  EXPECT_EQ(link->lanes(), 4u);

  const uint64_t size = 7 * kTransferChunk + 99;
  int fd = PatternFd(size);
  std::vector<unsigned char> bytes(size);
  ASSERT_EQ(pread(fd, bytes.data(), size, 0), static_cast<ssize_t>(size));
  v1::PeerRequest req;
  v1::PeerBackup* b = req.mutable_backup();
  b->set_job("j");
  b->set_path("/f");
  b->set_size(size);
  b->set_version(1);
  b->set_owner_node(0);
  v1::Record* r = b->add_records();
  r->set_size(size);
  r->set_crc32(Crc32(0, bytes.data(), size));
  ASSERT_TRUE(link->Send(req).ok());
  ASSERT_TRUE((s = tx_transport->Send(link.get(), SendSource{fd, size}, nullptr)).ok()) << s.ToString();
  v1::PeerReply reply;
  ASSERT_TRUE(link->Recv(&reply).ok());
  EXPECT_EQ(reply.code(), 0) << reply.message();
  HeldBackup held;
  int held_fd = -1;
  ASSERT_TRUE(store.Open("j", "/f", &held, &held_fd).ok());
  std::vector<unsigned char> copy(size);
  ASSERT_EQ(pread(held_fd, copy.data(), size, 0), static_cast<ssize_t>(size));
  EXPECT_EQ(copy, bytes);
  close(held_fd);
  close(fd);

  // A bind whose lanes never come: a clear refusal once the wait is over.
  std::unique_ptr<PeerLink> other;  // (its own timeouts only bound a hang)
  ASSERT_TRUE(PeerLink::Connect(server.endpoint(), "127.0.0.1:1", "t", 60s, &other).ok());
  v1::PeerRequest bind;
  bind.mutable_lanes()->set_key(std::string(16, 'k'));
  bind.mutable_lanes()->set_count(3);
  const uint64_t waits = clock.waits();
  ASSERT_TRUE(other->Send(bind).ok());
  ASSERT_TRUE(Eventually([&] { return clock.waits() > waits; }));  // the server waits for the lanes
  clock.Advance(options.io_timeout);
  ASSERT_TRUE(other->Recv(&reply).ok());
  EXPECT_EQ(reply.code(), static_cast<int>(Status::Code::kUnavailable));
  EXPECT_NE(reply.message().find("the lanes did not arrive"), std::string::npos) << reply.message();
  // A lane with a bad index is refused; the server goes on serving.
  std::unique_ptr<PeerLink> bad;
  ASSERT_TRUE(PeerLink::Connect(server.endpoint(), "127.0.0.1:1", "t", 2000ms, &bad).ok());
  v1::PeerRequest lane;
  lane.mutable_lane()->set_key(std::string(16, 'k'));
  lane.mutable_lane()->set_index(99);
  ASSERT_TRUE(bad->Send(lane).ok());
  EXPECT_EQ(bad->Recv(&reply).code(), Status::Code::kUnavailable);  // closed on us
  v1::PeerRequest list;
  list.mutable_list()->set_job("j");
  list.mutable_list()->set_job_uid(0);
  ASSERT_TRUE(link->Send(list).ok());
  v1::PeerListReply files;
  ASSERT_TRUE(link->Recv(&files).ok());
  ASSERT_EQ(files.files_size(), 1);
  EXPECT_EQ(files.files(0).path(), "/f");
  server.Stop();
}

}  // namespace
}  // namespace tce
