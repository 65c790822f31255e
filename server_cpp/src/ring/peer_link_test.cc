// The ring's handshake against peers that do not play by its rules: a proof
// relayed through a proxy, a connector that proves nothing, oversized and
// slow messages before authentication.
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <thread>

#include "ring/peer_link.h"
#include "tce/v1/tce.pb.h"

namespace tce {
namespace {
using namespace std::chrono_literals;

int Dial(const std::string& endpoint) {
  addrinfo* ai = nullptr;
  EXPECT_TRUE(ResolveEndpoint(endpoint, false, &ai).ok());
  int fd = socket(ai->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
  EXPECT_EQ(connect(fd, ai->ai_addr, ai->ai_addrlen), 0);
  freeaddrinfo(ai);
  SetIoTimeouts(fd, 3000ms);
  return fd;
}

void SendFrame(int fd, const std::string& body) {
  std::string frame(4, '\0');
  for (int i = 0; i < 4; ++i) frame[i] = static_cast<char>(body.size() >> (8 * i));
  frame += body;
  ASSERT_EQ(send(fd, frame.data(), frame.size(), MSG_NOSIGNAL), static_cast<ssize_t>(frame.size()));
}

// Reads one frame; false on EOF or error.
bool RecvFrame(int fd, std::string* body) {
  unsigned char len[4];
  if (recv(fd, len, 4, MSG_WAITALL) != 4) return false;
  const uint32_t n = len[0] | (len[1] << 8) | (len[2] << 16) | (static_cast<uint32_t>(len[3]) << 24);
  if (n > (1 << 20)) return false;
  body->assign(n, '\0');
  return n == 0 || recv(fd, &(*body)[0], n, MSG_WAITALL) == static_cast<ssize_t>(n);
}

// A one-connection acceptor on a fresh port, advertising the port it is on.
class Acceptor {
 public:
  explicit Acceptor(std::string token, std::chrono::milliseconds deadline = 2000ms) {
    EXPECT_TRUE(ListenTcp("127.0.0.1:0", &lfd_, &endpoint_).ok());
    thread_ = std::thread([this, token, deadline] {
      int fd = accept(lfd_, nullptr, nullptr);
      auto t0 = std::chrono::steady_clock::now();
      std::unique_ptr<PeerLink> link = PeerLink::Adopt(fd, 10000ms);
      status_ = link->AcceptHandshake(endpoint_, token, deadline);
      took_ = std::chrono::steady_clock::now() - t0;
      if (status_.ok()) link_ = std::move(link);
      done_ = true;
    });
  }
  ~Acceptor() {
    Join();
    close(lfd_);
  }
  void Join() {
    if (thread_.joinable()) thread_.join();
  }
  const std::string& endpoint() const { return endpoint_; }
  bool done() const { return done_; }  // the handshake ended (without waiting for it)
  Status status() {
    Join();
    return status_;
  }
  PeerLink* link() {
    Join();
    return link_.get();
  }
  std::chrono::steady_clock::duration took() {
    Join();
    return took_;
  }

 private:
  int lfd_ = -1;
  std::string endpoint_;
  std::thread thread_;
  Status status_;
  std::chrono::steady_clock::duration took_{};
  std::atomic<bool> done_{false};
  std::unique_ptr<PeerLink> link_;
};

v1::PeerHello Hello(const std::string& endpoint, int version = kPeerProtocolVersion) {
  v1::PeerHello h;
  h.set_nonce(std::string(32, 'n'));
  h.set_endpoint(endpoint);
  h.set_version(version);
  return h;
}

TEST(PeerHandshake, EachProofBindsDirectionNoncesAndEndpoints) {
  const std::string base = PeerProof("t", 'C', "nc", "na", "c:1", "a:1");
  EXPECT_EQ(base.size(), 32u);
  EXPECT_EQ(base, PeerProof("t", 'C', "nc", "na", "c:1", "a:1"));
  EXPECT_NE(base, PeerProof("t", 'A', "nc", "na", "c:1", "a:1"));
  EXPECT_NE(base, PeerProof("u", 'C', "nc", "na", "c:1", "a:1"));
  EXPECT_NE(base, PeerProof("t", 'C', "na", "nc", "c:1", "a:1"));  // nonces swapped
  EXPECT_NE(base, PeerProof("t", 'C', "nc", "na", "a:1", "c:1"));  // endpoints swapped
  EXPECT_NE(base, PeerProof("t", 'C', "nc", "nax", "c:1", "a:1"));
  EXPECT_NE(base, PeerProof("t", 'C', "n", "cna", "c:1", "a:1"));  // same bytes, other split
  EXPECT_NE(base, PeerProof("t", 'C', "nc", "na", "c:1", "a:2"));
}

TEST(PeerHandshake, TheAcceptorProvesNothingToAConnectorThatHasNotProven) {
  Acceptor a("token");
  int fd = Dial(a.endpoint());
  SendFrame(fd, Hello("attacker:1").SerializeAsString());
  std::string body;
  ASSERT_TRUE(RecvFrame(fd, &body));  // the acceptor's hello
  v1::PeerHello theirs;
  ASSERT_TRUE(theirs.ParseFromString(body));
  EXPECT_EQ(theirs.version(), kPeerProtocolVersion);
  v1::PeerAuth junk;
  junk.set_mac(std::string(32, 'x'));
  SendFrame(fd, junk.SerializeAsString());
  ASSERT_TRUE(RecvFrame(fd, &body));  // a refusal: an empty proof
  v1::PeerAuth refusal;
  ASSERT_TRUE(refusal.ParseFromString(body));
  EXPECT_EQ(refusal.mac(), "");
  EXPECT_FALSE(RecvFrame(fd, &body)) << "the acceptor said more: " << body.size() << " bytes";
  EXPECT_EQ(a.status().code(), Status::Code::kUnauthenticated);
  close(fd);
}

// A proxy between a real connector and a real acceptor (one token): the
// connector dialled the proxy, so its proof names the proxy, and the
// acceptor, which checks it against its own endpoint, refuses it. Under a
// protocol without that binding the proxy ends up holding an authenticated
// connection to the acceptor without knowing the token.
TEST(PeerHandshake, AProofRelayedThroughAnotherEndpointIsRefused) {
  Acceptor a("token");
  int lfd = -1;
  std::string proxy;
  ASSERT_TRUE(ListenTcp("127.0.0.1:0", &lfd, &proxy).ok());
  std::atomic<bool> acceptor_proved{false};
  std::thread relay([&] {
    int in = accept(lfd, nullptr, nullptr);
    int out = Dial(a.endpoint());
    std::string body;
    // hello ->, <- hello, proof ->, and whatever comes back
    for (int step = 0; step < 4; ++step) {
      const bool forward = step % 2 == 0;
      if (!RecvFrame(forward ? in : out, &body)) break;
      v1::PeerAuth answer;
      if (step == 3 && answer.ParseFromString(body) && !answer.mac().empty()) acceptor_proved = true;
      SendFrame(forward ? out : in, body);
    }
    close(in);
    close(out);
  });
  std::unique_ptr<PeerLink> c;
  Status cs = PeerLink::Connect(proxy, "127.0.0.1:4", "token", 2000ms, &c);
  relay.join();
  close(lfd);
  EXPECT_EQ(cs.code(), Status::Code::kUnauthenticated) << cs.ToString();
  EXPECT_NE(cs.message().find("refused our proof"), std::string::npos) << cs.message();
  Status as = a.status();
  EXPECT_EQ(as.code(), Status::Code::kUnauthenticated) << as.ToString();
  EXPECT_NE(as.message().find("was not dialled as " + a.endpoint()), std::string::npos) << as.message();
  EXPECT_FALSE(acceptor_proved);
}

TEST(PeerHandshake, AnOldProtocolPeerIsRefusedWithItsVersion) {
  Acceptor a("token");
  int fd = Dial(a.endpoint());
  SendFrame(fd, Hello("old:1", 1).SerializeAsString());
  std::string body;
  EXPECT_FALSE(RecvFrame(fd, &body));  // no hello for it
  Status s = a.status();
  EXPECT_EQ(s.code(), Status::Code::kUnauthenticated);
  EXPECT_NE(s.message().find("protocol version 1, not 2"), std::string::npos) << s.message();
  close(fd);
}

TEST(PeerHandshake, AHugeLengthPrefixBeforeAuthenticationIsRefusedAtOnce) {
  Acceptor a("token", 60s);  // waiting for the body would end in "too slow", a minute later
  int fd = Dial(a.endpoint());
  const unsigned char prefix[4] = {0, 0, 0, 4};  // 64 MiB
  ASSERT_EQ(send(fd, prefix, 4, MSG_NOSIGNAL), 4);
  Status s = a.status();
  EXPECT_EQ(s.code(), Status::Code::kUnauthenticated);
  EXPECT_NE(s.message().find("67108864-byte message (at most 4096 before authentication)"), std::string::npos)
      << s.message();
  close(fd);
}

TEST(PeerHandshake, ASlowSenderRunsOutOfOneDeadline) {
  Acceptor a("token", 800ms);
  int fd = Dial(a.endpoint());
  // A first message of 4000 bytes (under the 4096 allowed before
  // authentication), one byte every 100 ms: each receive sees progress, and
  // the bytes would keep coming for 400 s. The one deadline ends it while
  // they still come (a minute of them only bounds a hang).
  const unsigned char prefix[4] = {0xa0, 0x0f, 0, 0};  // 4000
  std::string frame(reinterpret_cast<const char*>(prefix), 4);
  frame += std::string(4000, 'x');
  size_t sent = 0;
  while (!a.done() && sent < 600) {
    if (send(fd, &frame[sent], 1, MSG_NOSIGNAL) != 1) break;  // closed: the handshake ended
    ++sent;
    std::this_thread::sleep_for(100ms);
  }
  Status s = a.status();
  EXPECT_EQ(s.code(), Status::Code::kUnauthenticated) << s.ToString();
  EXPECT_NE(s.message().find("too slow to authenticate"), std::string::npos) << s.message();
  EXPECT_LT(sent, 600u) << "the handshake outlasted a minute of progress";
  EXPECT_GE(a.took(), 800ms);
  close(fd);
}

TEST(LinkBreaker, BreakingEndsAConnectWaitingOnASilentPeerAndRefusesTheNext) {
  int lfd = -1;
  std::string endpoint;
  ASSERT_TRUE(ListenTcp("127.0.0.1:0", &lfd, &endpoint).ok());  // accepts, never answers
  LinkBreaker breaker;
  Status connected;
  std::thread connector([&] {
    std::unique_ptr<PeerLink> link;
    connected = PeerLink::Connect(endpoint, "127.0.0.1:1", "token", 600s, &link, &breaker);
  });
  const int peer = accept(lfd, nullptr, nullptr);  // the connector is in its handshake now
  ASSERT_GE(peer, 0);
  EXPECT_EQ(breaker.BreakAll(), 1u);
  connector.join();  // at once, not after the 600 s timeout
  EXPECT_FALSE(connected.ok());  // its hello or the peer's, whichever it was at
  std::unique_ptr<PeerLink> link;
  Status again = PeerLink::Connect(endpoint, "127.0.0.1:1", "token", 600s, &link, &breaker);
  EXPECT_EQ(again.code(), Status::Code::kUnavailable);
  EXPECT_NE(again.message().find("the server is stopping"), std::string::npos) << again.message();
  EXPECT_EQ(breaker.BreakAll(), 0u);  // the broken link unregistered itself as it went
  close(peer);
  close(lfd);
}

TEST(PeerHandshake, AnAuthenticatedLinkTakesLargeMessages) {
  Acceptor a("token");
  std::unique_ptr<PeerLink> c;
  ASSERT_TRUE(PeerLink::Connect(a.endpoint(), "127.0.0.1:5", "token", 2000ms, &c).ok());
  ASSERT_TRUE(a.status().ok());
  EXPECT_TRUE(c->authenticated());
  v1::PeerDrop big, in;
  big.set_path(std::string(3 << 20, 'p'));  // grows the receive buffer past its first step
  ASSERT_TRUE(c->Send(big).ok());
  ASSERT_TRUE(a.link()->Recv(&in).ok());
  EXPECT_EQ(in.path(), big.path());
}

}  // namespace
}  // namespace tce
