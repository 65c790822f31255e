#include <gtest/gtest.h>
#include <sys/socket.h>
#include <unistd.h>

#include <thread>

#include "cache/cache.h"
#include "cache/tag_proto.h"
#include "common/manual_clock.h"
#include "common/testing.h"
#include "persist/crc.h"
#include "ring/backup_store.h"
#include "ring/peer_link.h"
#include "ring/peer_testing.h"
#include "tce/v1/tce.pb.h"

namespace tce {
namespace {
using namespace std::chrono_literals;

// Connects a client link to a one-shot acceptor; returns both outcomes.
// `timeout` is the handshake's deadline and then the links' I/O timeout.
void Pair(const std::string& client_token, const std::string& server_token, Status* client,
          Status* server, std::unique_ptr<PeerLink>* c, std::unique_ptr<PeerLink>* s,
          std::chrono::milliseconds timeout = 2000ms) {
  int lfd = -1;
  std::string bound;
  ASSERT_TRUE(ListenTcp("127.0.0.1:0", &lfd, &bound).ok());
  std::thread acceptor([&] {
    int fd = accept(lfd, nullptr, nullptr);
    *server = PeerLink::Accept(fd, bound, server_token, timeout, s);
  });
  *client = PeerLink::Connect(bound, "127.0.0.1:2", client_token, timeout, c);
  acceptor.join();
  close(lfd);
}

TEST(PeerLink, AuthenticatesBothWaysAndCarriesMessages) {
  Status cs, ss;
  std::unique_ptr<PeerLink> c, s;
  Pair("token", "token", &cs, &ss, &c, &s);
  ASSERT_TRUE(cs.ok()) << cs.ToString();
  ASSERT_TRUE(ss.ok()) << ss.ToString();
  EXPECT_EQ(c->peer().rfind("127.0.0.1:", 0), 0u) << c->peer();  // the acceptor advertises where it was dialled
  EXPECT_EQ(s->peer(), "127.0.0.1:2");
  v1::PeerDrop out, in;
  out.set_job("j");
  out.set_path("/p\nq");
  out.set_version(7);
  ASSERT_TRUE(c->Send(out).ok());
  ASSERT_TRUE(s->Recv(&in).ok());
  EXPECT_EQ(in.path(), "/p\nq");
  EXPECT_EQ(in.version(), 7u);
}

TEST(PeerLink, AWrongTokenIsRefusedOnBothSides) {
  Status cs, ss;
  std::unique_ptr<PeerLink> c, s;
  Pair("guess", "token", &cs, &ss, &c, &s);
  EXPECT_EQ(ss.code(), Status::Code::kUnauthenticated);
  EXPECT_NE(ss.message().find("does not know the cluster token"), std::string::npos) << ss.message();
  EXPECT_EQ(cs.code(), Status::Code::kUnauthenticated) << cs.ToString();
  EXPECT_EQ(c, nullptr);
  EXPECT_EQ(s, nullptr);
}

TEST(PeerLink, ConnectingToNobodyFailsQuickly) {
  int lfd = -1;
  std::string bound;
  ASSERT_TRUE(ListenTcp("127.0.0.1:0", &lfd, &bound).ok());
  close(lfd);  // the port is free again: nobody listens
  std::unique_ptr<PeerLink> c;
  Status st = PeerLink::Connect(bound, "127.0.0.1:1", "t", 1000ms, &c);
  EXPECT_EQ(st.code(), Status::Code::kUnavailable) << st.ToString();
  EXPECT_EQ(PeerLink::Connect("nocolon", "127.0.0.1:1", "t", 1000ms, &c).code(), Status::Code::kInvalidArgument);
}

TEST(PeerLink, APeerThatStopsAnsweringTimesOutAndACallersDeadlineEndsTheWaitFirst) {
  Status cs, ss;
  std::unique_ptr<PeerLink> c, s;
  Pair("token", "token", &cs, &ss, &c, &s);
  ASSERT_TRUE(cs.ok() && ss.ok()) << cs.ToString() << " " << ss.ToString();
  c->SetIoTimeout(200ms);
  v1::PeerReply reply;
  Status silent = c->Recv(&reply);  // the peer says nothing (alive, its socket open)
  EXPECT_EQ(silent.code(), Status::Code::kUnavailable) << silent.ToString();
  EXPECT_NE(silent.message().find("said nothing for 200 ms"), std::string::npos) << silent.message();
  EXPECT_TRUE(c->timed_out());
  c->SetIoTimeout(std::chrono::minutes(10));
  c->SetDeadline(Clock::Real()->Now() + 50ms);  // the caller's: long before the timeout
  Status cut = c->Recv(&reply);
  EXPECT_EQ(cut.code(), Status::Code::kDeadlineExceeded) << cut.ToString();
  EXPECT_NE(cut.message().find("the caller's deadline"), std::string::npos) << cut.message();
  c->ClearDeadline();
  v1::PeerDrop out;
  out.set_job("j");
  ASSERT_TRUE(s->Send(out).ok());
  v1::PeerDrop in;
  ASSERT_TRUE(c->Recv(&in).ok());  // the link still carries messages
  EXPECT_EQ(in.job(), "j");
}

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

}  // namespace
}  // namespace tce

#include <sys/mman.h>

#include <csignal>

#include "ring/fabric_select.h"
#include "ring/peer_server.h"
#include "ring/corrupting_transport.h"
#include "ring/tcp_transport.h"
#include "ring/transport_factory.h"

namespace tce {
namespace {

// A memfd of `size` patterned bytes.
int PatternFd(uint64_t size) {
  int fd = memfd_create("t", MFD_CLOEXEC);
  std::string bytes(size, '\0');
  for (uint64_t i = 0; i < size; ++i) bytes[i] = static_cast<char>(i * 31 + i / 4093);
  EXPECT_EQ(write(fd, bytes.data(), size), static_cast<ssize_t>(size));
  return fd;
}

class TransportTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    TransportOptions o;
    o.name = GetParam() == "tcp4" ? "tcp" : GetParam();
    o.streams = GetParam() == "tcp4" ? 4 : 1;
    o.ofi_provider = "tcp";
    o.source_host = "127.0.0.1";
    o.io_timeout = 120s;  // far beyond any test: a wait that times out is a failure
    Status st = NewTransport(o, &sender_);
    ASSERT_TRUE(st.ok()) << st.ToString();
    ASSERT_TRUE((st = NewTransport(o, &receiver_)).ok()) << st.ToString();
    Status cs, ss;
    // The links' (tcp's) I/O timeout too: else a lane waiting on a broken
    // peer gives up after Pair's 2 s, and a test cannot tell that from the break.
    Pair("t", "t", &cs, &ss, &c_, &s_, o.io_timeout);
    ASSERT_TRUE(cs.ok() && ss.ok());
    for (int i = 1; i < sender_->lanes(); ++i) {  // what OpenLanes and the PeerServer set up
      std::unique_ptr<PeerLink> c, s;
      Pair("t", "t", &cs, &ss, &c, &s, o.io_timeout);
      ASSERT_TRUE(cs.ok() && ss.ok());
      c_->AddLane(std::move(c));
      s_->AddLane(std::move(s));
    }
  }
  std::unique_ptr<Transport> sender_, receiver_;
  std::unique_ptr<PeerLink> c_, s_;
};

// Into memory, and into a memfd (what the server's buffers are: tcp writes
// it through a buffer of its own, ofi the mapping); `landed` sees each byte
// once, in order, as it landed.
TEST_P(TransportTest, MovesEveryByteAndReportsChunksInOrder) {
  for (bool into_memfd : {false, true}) {
    for (uint64_t size : {uint64_t{0}, uint64_t{1}, kTransferChunk, 5 * kTransferChunk + 12345}) {
      int fd = PatternFd(size);
      std::vector<unsigned char> want(size);
      ASSERT_EQ(pread(fd, want.data(), size, 0), static_cast<ssize_t>(size));
      std::vector<unsigned char> mem(size + 1, 0xee);
      int dst_fd = -1;
      unsigned char* map = mem.data();
      if (into_memfd) {
        dst_fd = memfd_create("dst", MFD_CLOEXEC);
        ASSERT_GE(dst_fd, 0);
        ASSERT_EQ(pwrite(dst_fd, mem.data(), size + 1, 0), static_cast<ssize_t>(size + 1));
        void* m = mmap(nullptr, size + 1, PROT_READ | PROT_WRITE, MAP_SHARED, dst_fd, 0);
        ASSERT_NE(m, MAP_FAILED);
        map = static_cast<unsigned char*>(m);
      }
      std::vector<std::pair<uint64_t, uint64_t>> before, landed;
      size_t landed_wrong = 0;
      Status rs;
      std::thread rx([&] {
        rs = receiver_->Recv(s_.get(), RecvDest{map, dst_fd}, size, [&](uint64_t o, uint64_t n, const unsigned char* d) {
          landed.push_back({o, n});
          landed_wrong += o + n > size || memcmp(d, want.data() + o, n) != 0;
        });
      });
      Status ss = sender_->Send(c_.get(), SendSource{fd, size}, [&](uint64_t o, uint64_t n) { before.push_back({o, n}); });
      rx.join();
      ASSERT_TRUE(ss.ok()) << ss.ToString();
      ASSERT_TRUE(rs.ok()) << rs.ToString();
      if (into_memfd) {
        ASSERT_EQ(pread(dst_fd, mem.data(), size + 1, 0), static_cast<ssize_t>(size + 1));
        munmap(map, size + 1);
        close(dst_fd);
      }
      EXPECT_TRUE(std::equal(want.begin(), want.end(), mem.begin())) << "size " << size << " memfd " << into_memfd;
      EXPECT_EQ(mem[size], 0xee);  // nothing past the end
      EXPECT_EQ(landed_wrong, 0u);
      for (auto* seen : {&before, &landed}) {
        uint64_t next = 0;
        for (auto [o, n] : *seen) {
          EXPECT_EQ(o, next);
          next += n;
        }
        EXPECT_EQ(next, size);
      }
      close(fd);
    }
  }
}

TEST_P(TransportTest, ARefusedTransferFailsTheSenderWithTheReason) {
  const uint64_t size = 3 * kTransferChunk;
  int fd = PatternFd(size);
  Status rs;
  std::thread rx([&] { rs = receiver_->Refuse(s_.get(), size, Status::ResourceExhausted("backup share full")); });
  Status ss = sender_->Send(c_.get(), SendSource{fd, size}, nullptr);
  rx.join();
  close(fd);
  if (GetParam() != "ofi") {  // tcp drains: both sides stay in step
    EXPECT_TRUE(ss.ok() && rs.ok()) << ss.ToString() << rs.ToString();
  } else {
    EXPECT_EQ(ss.code(), Status::Code::kResourceExhausted) << ss.ToString();
    EXPECT_NE(ss.message().find("backup share full"), std::string::npos);
    EXPECT_EQ(rs.code(), Status::Code::kResourceExhausted);
  }
  // The link still carries messages.
  v1::PeerDrop m, got;
  m.set_path("/after");
  ASSERT_TRUE(c_->Send(m).ok());
  ASSERT_TRUE(s_->Recv(&got).ok());
  EXPECT_EQ(got.path(), "/after");
}

TEST_P(TransportTest, TheCorruptingTransportFlipsOneByte) {
  std::unique_ptr<Transport> bad = NewCorruptingTransport(std::move(sender_));
  const uint64_t size = kTransferChunk + 7;
  int fd = PatternFd(size);
  std::vector<unsigned char> dst(size), want(size);
  ASSERT_EQ(pread(fd, want.data(), size, 0), static_cast<ssize_t>(size));
  Status rs;
  std::thread rx([&] { rs = receiver_->Recv(s_.get(), RecvDest{dst.data()}, size, nullptr); });
  ASSERT_TRUE(bad->Send(c_.get(), SendSource{fd, size}, nullptr).ok());
  rx.join();
  ASSERT_TRUE(rs.ok());
  size_t differ = 0;
  for (uint64_t i = 0; i < size; ++i) differ += dst[i] != want[i];
  EXPECT_EQ(differ, 1u);
  close(fd);
}

TEST_P(TransportTest, ALinkThatBreaksMidTransferFailsBothSidesPromptly) {
  signal(SIGPIPE, SIG_IGN);  // as tce-server does: a dead peer is an error, not a signal
  const uint64_t size = 32 * kTransferChunk;
  int fd = PatternFd(size);
  std::vector<unsigned char> dst(size);
  Status rs;
  std::thread rx([&] { rs = receiver_->Recv(s_.get(), RecvDest{dst.data()}, size, nullptr); });
  auto t0 = std::chrono::steady_clock::now();
  // The sender's last lane breaks before chunk 2 goes. A chunk moves only
  // after its `before` ran, so that lane still has chunks to move whatever
  // the timing. (Breaking the receiver's lane from `landed` raced: lanes
  // receive ahead of the in-order callbacks, and under load the last lane
  // could already hold all of its chunks.)
  Status ss = sender_->Send(c_.get(), SendSource{fd, size}, [&](uint64_t off, uint64_t) {
    if (off == 2 * kTransferChunk) shutdown(c_->lane(c_->lanes() - 1)->fd(), SHUT_RDWR);
  });
  rx.join();
  close(fd);
  EXPECT_FALSE(ss.ok());
  EXPECT_EQ(rs.code(), Status::Code::kUnavailable) << rs.ToString();
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 60s);  // the break was seen, not the I/O timeout
}

// ofi where this build has libfabric (transport_factory_test.cc checks what
// a build without it says).
std::vector<std::string> Transports() {
  std::vector<std::string> names = {"tcp", "tcp4"};
  if (TCE_WITH_LIBFABRIC) names.push_back("ofi");
  return names;
}

INSTANTIATE_TEST_SUITE_P(Each, TransportTest, ::testing::ValuesIn(Transports()),
                         [](const auto& info) { return info.param; });

TEST(DeviceFilter, FollowsNcclIbHcaSyntax) {
  const std::vector<std::string> all = {"mlx5_0", "mlx5_1", "mlx5_10", "mlx4_0", "eth0"};
  using V = std::vector<std::string>;
  EXPECT_EQ(FilterDevices(all, ParseDeviceFilter("")), all);
  EXPECT_EQ(FilterDevices(all, ParseDeviceFilter("mlx5_1")), (V{"mlx5_1", "mlx5_10"}));  // prefixes
  EXPECT_EQ(FilterDevices(all, ParseDeviceFilter("=mlx5_1")), (V{"mlx5_1"}));           // exact
  EXPECT_EQ(FilterDevices(all, ParseDeviceFilter("mlx5_0:1, mlx4")), (V{"mlx5_0", "mlx4_0"}));
  EXPECT_EQ(FilterDevices(all, ParseDeviceFilter("^mlx5")), (V{"mlx4_0", "eth0"}));
  EXPECT_EQ(FilterDevices(all, ParseDeviceFilter("^=mlx5_1")), (V{"mlx5_0", "mlx5_10", "mlx4_0", "eth0"}));
  DeviceFilter f = ParseDeviceFilter("^=a:1,b");
  EXPECT_TRUE(f.exclude && f.exact);
  EXPECT_EQ(f.names, (V{"a", "b"}));
}

TEST(DeviceFilter, DividesDevicesAmongLocalRanks) {
  using V = std::vector<std::string>;
  const V four = {"d0", "d1", "d2", "d3"};
  EXPECT_EQ(DevicesForLocalRank(four, 0, 2), (V{"d0", "d1"}));
  EXPECT_EQ(DevicesForLocalRank(four, 1, 2), (V{"d2", "d3"}));
  EXPECT_EQ(DevicesForLocalRank(four, 3, 4), (V{"d3"}));
  EXPECT_EQ(DevicesForLocalRank(four, 5, 8), (V{"d1"}));  // fewer devices than ranks
  EXPECT_EQ(DevicesForLocalRank({}, 0, 8), V{});
}

TEST(DeviceFilter, EnvironmentPrecedence) {
  std::string var;
  unsetenv("TCE_RDMA_DEVICES");
  setenv("NCCL_IB_HCA", "^mlx5_3", 1);
  EXPECT_EQ(DeviceSpecFromEnv(&var), "^mlx5_3");
  EXPECT_EQ(var, "NCCL_IB_HCA");
  setenv("TCE_RDMA_DEVICES", "=lo", 1);
  EXPECT_EQ(DeviceSpecFromEnv(&var), "=lo");
  EXPECT_EQ(var, "TCE_RDMA_DEVICES");
  unsetenv("TCE_RDMA_DEVICES");
  unsetenv("NCCL_IB_HCA");
  EXPECT_EQ(DeviceSpecFromEnv(&var), "");
  EXPECT_EQ(var, "");
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
