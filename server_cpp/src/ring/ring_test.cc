// The ring's links and transports: PeerLink's handshake and timeouts, each
// transport's transfers (refused, corrupted, broken) and the RDMA device filter.
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#include <csignal>
#include <thread>

#include "ring/corrupting_transport.h"
#include "ring/fabric_select.h"
#include "ring/peer_link.h"
#include "ring/peer_testing.h"
#include "ring/transport_factory.h"
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

}  // namespace
}  // namespace tce
