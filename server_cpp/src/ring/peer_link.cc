#include "ring/peer_link.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>
#include <poll.h>
#include <sys/sendfile.h>
#include <sys/socket.h>
#include <unistd.h>

#include <fcntl.h>

#include <cerrno>
#include <cstdlib>
#include <algorithm>
#include <cstring>
#include <memory>
#include <vector>

#include "tce/v1/tce.pb.h"

namespace tce {
namespace {

void Put(std::string* out, const std::string& field) {
  const uint32_t n = static_cast<uint32_t>(field.size());
  for (int i = 0; i < 4; ++i) out->push_back(static_cast<char>(n >> (8 * i)));
  out->append(field);
}

// What both proofs of a handshake cover: a label, the direction, both
// nonces and both endpoints, each length-prefixed.
std::string Transcript(const char* label, char direction, const std::string& connector_nonce,
                       const std::string& acceptor_nonce, const std::string& connector_endpoint,
                       const std::string& acceptor_endpoint) {
  std::string data = label;
  data.push_back(direction);
  Put(&data, connector_nonce);
  Put(&data, acceptor_nonce);
  Put(&data, connector_endpoint);
  Put(&data, acceptor_endpoint);
  return data;
}

void SetTimeouts(int fd, std::chrono::milliseconds timeout) {
  SetIoTimeouts(fd, timeout);
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &one, sizeof(one));
}

std::string RemoteAddress(int fd) {
  sockaddr_storage ss{};
  socklen_t len = sizeof(ss);
  if (getpeername(fd, reinterpret_cast<sockaddr*>(&ss), &len) != 0) return "?";
  char host[INET6_ADDRSTRLEN] = "?";
  int port = 0;
  if (ss.ss_family == AF_INET) {
    auto* a = reinterpret_cast<sockaddr_in*>(&ss);
    inet_ntop(AF_INET, &a->sin_addr, host, sizeof(host));
    port = ntohs(a->sin_port);
  } else if (ss.ss_family == AF_INET6) {
    auto* a = reinterpret_cast<sockaddr_in6*>(&ss);
    inet_ntop(AF_INET6, &a->sin6_addr, host, sizeof(host));
    port = ntohs(a->sin6_port);
  }
  return std::string(host) + ":" + std::to_string(port);
}

}  // namespace

std::string PeerProof(const std::string& token, char direction, const std::string& connector_nonce,
                      const std::string& acceptor_nonce, const std::string& connector_endpoint,
                      const std::string& acceptor_endpoint) {
  const std::string data =
      Transcript("tce-ring-proof-v2", direction, connector_nonce, acceptor_nonce, connector_endpoint, acceptor_endpoint);
  unsigned char out[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  HMAC(EVP_sha256(), token.data(), static_cast<int>(token.size()),
       reinterpret_cast<const unsigned char*>(data.data()), data.size(), out, &len);
  return std::string(reinterpret_cast<char*>(out), len);
}

PeerLink::~PeerLink() {
  if (breaker_) breaker_->Remove(fd_);
  ::close(fd_);
}

Status PeerLink::Connect(const std::string& endpoint, const std::string& self,
                         const PeerKey& key, std::chrono::milliseconds timeout,
                         std::unique_ptr<PeerLink>* out, LinkBreaker* breaker) {
  addrinfo* ai = nullptr;
  Status s = ResolveEndpoint(endpoint, false, &ai);
  if (!s.ok()) return s;
  int fd = socket(ai->ai_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (fd < 0) {
    freeaddrinfo(ai);
    return Status::FromErrno(errno, "socket");
  }
  if (breaker && !breaker->Add(fd)) {
    freeaddrinfo(ai);
    ::close(fd);
    return Status::Unavailable("not connecting to peer " + endpoint + ": the server is stopping");
  }
  BindSource(fd, ai->ai_family, self);  // peers check we come from what we advertise
  int rc = connect(fd, ai->ai_addr, ai->ai_addrlen);
  freeaddrinfo(ai);
  if (rc != 0 && errno == EINPROGRESS) {  // bounded connect: a dead peer must not hang us
    pollfd p{fd, POLLOUT, 0};
    rc = poll(&p, 1, static_cast<int>(timeout.count()));
    int err = 0;
    socklen_t len = sizeof(err);
    if (rc == 1) getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len);
    if (rc == 1 && err == 0) rc = 0;
    else errno = rc == 0 ? ETIMEDOUT : err;
    if (rc != 0) rc = -1;
  }
  if (rc != 0) {
    int err = errno;
    if (breaker) breaker->Remove(fd);
    ::close(fd);
    return Status::Unavailable("connect to peer " + endpoint + ": " + std::strerror(err));
  }
  fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) & ~O_NONBLOCK);  // blocking again, with timeouts
  SetTimeouts(fd, timeout);
  std::unique_ptr<PeerLink> link(new PeerLink(fd, endpoint));
  link->breaker_ = breaker;
  link->io_timeout_ = timeout;
  s = link->Handshake(true, self, endpoint, key, timeout);
  if (!s.ok()) return s;
  *out = std::move(link);
  return Status::OK();
}

std::unique_ptr<PeerLink> PeerLink::Adopt(int fd, std::chrono::milliseconds io_timeout) {
  SetTimeouts(fd, io_timeout);
  std::unique_ptr<PeerLink> link(new PeerLink(fd, RemoteAddress(fd)));
  link->io_timeout_ = io_timeout;
  return link;
}

Status PeerLink::Accept(int fd, const std::string& self, const PeerKey& key,
                        std::chrono::milliseconds timeout, std::unique_ptr<PeerLink>* out) {
  std::unique_ptr<PeerLink> link = Adopt(fd, timeout);
  Status s = link->AcceptHandshake(self, key, timeout);
  if (s.ok()) *out = std::move(link);
  return s;
}

Status PeerLink::AcceptHandshake(const std::string& self, const PeerKey& key,
                                 std::chrono::milliseconds deadline) {
  return Handshake(false, self, self, key, deadline);
}

Status PeerLink::Handshake(bool connecting, const std::string& self, const std::string& dialled,
                           const PeerKey& key, std::chrono::milliseconds deadline) {
  deadline_ = Clock::Real()->Now() + deadline;  // real time: the socket timeouts follow it
  Status s = HandshakeSteps(connecting, self, dialled, key);
  deadline_ = {};
  SetIoTimeouts(fd_, io_timeout_);  // the handshake shortened them
  if (s.ok()) authenticated_ = true;
  return s;
}

Status PeerLink::HandshakeSteps(bool connecting, const std::string& self, const std::string& dialled,
                                const PeerKey& key) {
  std::string nonce(32, '\0');
  if (RAND_bytes(reinterpret_cast<unsigned char*>(&nonce[0]), 32) != 1)
    return Status::Internal("no randomness for the peer handshake");
  v1::PeerHello mine, theirs;
  mine.set_nonce(nonce);
  mine.set_endpoint(self);
  mine.set_version(kPeerProtocolVersion);
  mine.set_certificate(key.cert != nullptr);
  // The connector speaks first; the acceptor answers only a well-formed hello.
  Status s;
  if (connecting && !(s = Send(mine)).ok()) return s;
  if (!(s = Recv(&theirs)).ok()) {
    if (connecting && s.code() == Status::Code::kDeadlineExceeded)  // silent: not answering (a hung server)
      return Status::DeadlineExceeded("peer " + address_ + " did not answer the handshake: " + s.message());
    return Status::Unauthenticated("peer " + address_ + " did not complete the handshake: " + s.message());
  }
  if (theirs.version() != kPeerProtocolVersion || theirs.nonce().size() != 32)
    return Status::Unauthenticated("peer " + address_ + " speaks protocol version " +
                                   std::to_string(theirs.version()) + ", not " +
                                   std::to_string(kPeerProtocolVersion));
  // An endpoint is host:port: printable, short (it goes into logs and proofs).
  const std::string& e = theirs.endpoint();
  if (e.empty() || e.size() > 256 ||
      !std::all_of(e.begin(), e.end(), [](char c) { return c > ' ' && c < 0x7f; }))
    return Status::Unauthenticated("peer " + address_ + " announced no valid endpoint");
  if (!connecting && !(s = Send(mine)).ok()) return s;
  if (theirs.certificate() != mine.certificate())  // a cluster uses node certificates everywhere, or nowhere
    return Status::Unauthenticated("peer " + address_ + " (says " + e + ") " +
                                   (theirs.certificate() ? "proves its node with a certificate and this server has none"
                                                         : "has no node certificate and this server requires one") +
                                   " (peer_cert_file)");
  const std::string& cn = connecting ? nonce : theirs.nonce();
  const std::string& an = connecting ? theirs.nonce() : nonce;
  // The connector binds the endpoint it dialled; the acceptor its own. A
  // proof relayed from a connection to anyone else names another acceptor.
  const std::string& connector = connecting ? self : theirs.endpoint();
  const std::string& acceptor = dialled;
  v1::PeerAuth proof, their_proof;
  if (connecting) {
    proof.set_mac(PeerProof(key.token, 'C', cn, an, connector, acceptor));
    if (!(s = Send(proof)).ok()) return s;
  }
  if (!(s = Recv(&their_proof)).ok())
    return Status::Unauthenticated("peer " + address_ + " did not authenticate: " + s.message());
  if (connecting && their_proof.mac().empty())
    return Status::Unauthenticated("peer " + address_ + " refused our proof: it does not know our "
                                   "cluster token, or it advertises another endpoint than " + acceptor);
  const std::string want = PeerProof(key.token, connecting ? 'A' : 'C', cn, an, connector, acceptor);
  if (their_proof.mac().size() != want.size() ||
      CRYPTO_memcmp(their_proof.mac().data(), want.data(), want.size()) != 0) {
    if (!connecting) {  // say so, proving nothing: an empty proof
      v1::PeerAuth refusal;
      Status ignored = Send(refusal);
      (void)ignored;
    }
    return Status::Unauthenticated("peer " + address_ + " (says " + theirs.endpoint() +
                                   ") does not know the cluster token, or was not dialled as " +
                                   acceptor);
  }
  if (!connecting) {  // a token holder is not whoever it names: it must come from there
    s = CheckPeerSource(fd_, theirs.endpoint());
    if (!s.ok()) {
      v1::PeerAuth refusal;
      Status ignored = Send(refusal);
      (void)ignored;
      return Status::Unauthenticated("peer " + address_ + " knows the token but is not " + theirs.endpoint() +
                                     ": " + s.message());
    }
  }
  if (!connecting) {  // only now, with the connector proven, do we prove ourselves
    proof.set_mac(PeerProof(key.token, 'A', cn, an, connector, acceptor));
    if (!(s = Send(proof)).ok()) return s;
  }
  if (key.cert) {  // the token says "of the cluster"; the certificate says which node
    s = ProveNode(connecting, *key.cert, cn, an, connector, acceptor);
    if (!s.ok()) return s;
  }
  peer_ = theirs.endpoint();
  return Status::OK();
}

std::string CertTranscript(char direction, const std::string& connector_nonce, const std::string& acceptor_nonce,
                           const std::string& connector_endpoint, const std::string& acceptor_endpoint) {
  return Transcript("tce-ring-cert-v1", direction, connector_nonce, acceptor_nonce, connector_endpoint,
                    acceptor_endpoint);
}

Status PeerLink::ProveNode(bool connecting, const NodeCert& cert, const std::string& cn, const std::string& an,
                           const std::string& connector, const std::string& acceptor) {
  auto prove = [&](char direction) {
    v1::PeerCertProof mine;
    mine.set_certificate(cert.der());
    Status s = cert.Sign(CertTranscript(direction, cn, an, connector, acceptor), mine.mutable_signature());
    return s.ok() ? Send(mine) : s;
  };
  Status s;
  if (connecting && !(s = prove('C')).ok()) return s;
  v1::PeerCertProof theirs;
  if (!(s = Recv(&theirs)).ok())
    return Status::Unauthenticated("peer " + address_ + " sent no node certificate: " + s.message());
  // The certificate must name the host of the endpoint the peer is to us:
  // the one it announced (acceptor side), the one we dialled (connector side).
  const std::string& endpoint = connecting ? acceptor : connector;
  std::string host;
  int port = 0;
  s = ParseEndpoint(endpoint, &host, &port);
  if (s.ok())
    s = cert.Verify(theirs.certificate(), host, CertTranscript(connecting ? 'A' : 'C', cn, an, connector, acceptor),
                    theirs.signature());
  if (!s.ok()) {
    if (!connecting) {  // say so, proving nothing: an empty certificate
      Status ignored = Send(v1::PeerCertProof());
      (void)ignored;
    }
    return Status::Unauthenticated("peer " + address_ + " is not node " + endpoint + " by certificate: " +
                                   s.message());
  }
  if (!connecting && !(s = prove('A')).ok()) return s;
  return Status::OK();
}

void PeerLink::SetDeadline(Clock::TimePoint deadline) {
  for (size_t i = 0; i < lanes(); ++i) lane(i)->call_deadline_ = deadline;
}

void PeerLink::ClearDeadline() {
  for (size_t i = 0; i < lanes(); ++i) {
    PeerLink* l = lane(i);
    if (l->call_deadline_ == Clock::TimePoint{}) continue;
    l->call_deadline_ = {};
    SetIoTimeouts(l->fd_, l->io_timeout_);  // the deadline shortened them
  }
}

void PeerLink::SetIoTimeout(std::chrono::milliseconds timeout) {
  for (size_t i = 0; i < lanes(); ++i) {
    lane(i)->io_timeout_ = timeout;
    SetIoTimeouts(lane(i)->fd_, timeout);
  }
}

bool PeerLink::timed_out() const {
  if (timed_out_) return true;
  for (const auto& l : lanes_)
    if (l->timed_out_) return true;
  return false;
}

void PeerLink::Break() {
  for (size_t i = 0; i < lanes(); ++i) shutdown(lane(i)->fd(), SHUT_RDWR);
}

void PeerLink::Abort() {
  const linger reset{1, 0};
  for (size_t i = 0; i < lanes(); ++i)
    setsockopt(lane(i)->fd(), SOL_SOCKET, SO_LINGER, &reset, sizeof(reset));
}

Status OpenLanes(PeerLink* link, const std::string& endpoint, const std::string& self,
                 const PeerKey& peer_key, std::chrono::milliseconds timeout, int count,
                 LinkBreaker* breaker) {
  if (count < 2 || count > kMaxLanes)
    return Status::InvalidArgument("a link has 2 to " + std::to_string(kMaxLanes) + " lanes, not " +
                                   std::to_string(count));
  std::string key(16, '\0');
  if (RAND_bytes(reinterpret_cast<unsigned char*>(&key[0]), static_cast<int>(key.size())) != 1)
    return Status::Internal("no randomness for a lane key");
  for (int i = 1; i < count; ++i) {
    std::unique_ptr<PeerLink> lane;
    Status s = PeerLink::Connect(endpoint, self, peer_key, timeout, &lane, breaker);
    v1::PeerRequest hello;
    hello.mutable_lane()->set_key(key);
    hello.mutable_lane()->set_index(i);
    if (s.ok()) s = lane->Send(hello);
    if (!s.ok()) return s;
    link->AddLane(std::move(lane));
  }
  v1::PeerRequest bind;
  bind.mutable_lanes()->set_key(key);
  bind.mutable_lanes()->set_count(count);
  v1::PeerReply reply;
  Status s = link->Send(bind);
  if (s.ok()) s = link->Recv(&reply);
  if (s.ok() && reply.code() != 0)
    s = Status::Unavailable("peer " + endpoint + " did not bind " + std::to_string(count - 1) +
                            " lanes: " + reply.message());
  return s;
}

Status PeerLink::SendAll(const void* data, size_t n) {
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    ssize_t w = ::send(fd_, p, n, MSG_NOSIGNAL);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return Status::Unavailable("send to peer " + address_ + ": " + std::strerror(errno));
    p += w;
    n -= static_cast<size_t>(w);
  }
  return Status::OK();
}

Status PeerLink::SendFile(int fd, uint64_t offset, uint64_t n) {
  off_t at = static_cast<off_t>(offset);
  while (static_cast<uint64_t>(at) < offset + n) {
    ssize_t sent = sendfile(fd_, fd, &at, static_cast<size_t>(offset + n - static_cast<uint64_t>(at)));
    if (sent < 0 && errno == EINTR) continue;
    // hugetlbfs has no splice: its files (huge-page buffers) are read instead.
    if (sent < 0 && (errno == EINVAL || errno == ENOSYS || errno == EOPNOTSUPP))
      return SendByReading(fd, static_cast<uint64_t>(at), offset + n - static_cast<uint64_t>(at));
    if (sent <= 0)
      return Status::Unavailable("sendfile to peer " + address_ + ": " +
                                 (sent == 0 ? std::string("end of buffer") : std::strerror(errno)));
  }
  return Status::OK();
}

Status PeerLink::SendByReading(int fd, uint64_t offset, uint64_t n) {
  constexpr size_t kBounce = 1 << 20;
  thread_local std::unique_ptr<char[]> bounce(new char[kBounce]);
  while (n > 0) {
    const ssize_t r = pread(fd, bounce.get(), static_cast<size_t>(std::min<uint64_t>(n, kBounce)),
                            static_cast<off_t>(offset));
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0)
      return Status::Unavailable("read the buffer for peer " + address_ + ": " +
                                 (r == 0 ? std::string("end of buffer") : std::strerror(errno)));
    Status s = SendAll(bounce.get(), static_cast<size_t>(r));
    if (!s.ok()) return s;
    offset += static_cast<uint64_t>(r);
    n -= static_cast<uint64_t>(r);
  }
  return Status::OK();
}

Status PeerLink::RecvAll(void* data, size_t n) {
  char* p = static_cast<char*>(data);
  while (n > 0) {
    if (deadline_ != Clock::TimePoint{}) {  // the handshake: one deadline for all
      const auto left = Clock::Real()->Left(deadline_);
      if (left.count() <= 0)
        return Status::DeadlineExceeded("peer " + address_ + " was too slow to authenticate");
      SetIoTimeouts(fd_, left);
    } else if (call_deadline_ != Clock::TimePoint{}) {  // the caller's: the I/O timeout, or less
      const auto left = Clock::Real()->Left(call_deadline_);
      if (left.count() <= 0)
        return Status::DeadlineExceeded("the caller's deadline passed while waiting for peer " + address_);
      SetIoTimeouts(fd_, std::min(left, io_timeout_));
    }
    ssize_t r = ::recv(fd_, p, n, MSG_WAITALL);
    if (r < 0 && errno == EINTR) continue;
    if (r == 0) return Status::Unavailable("peer " + address_ + " closed the connection");
    const bool silent = r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK);
    if (silent && deadline_ != Clock::TimePoint{}) continue;  // the deadline check above ends it
    if (silent && call_deadline_ != Clock::TimePoint{} && Clock::Real()->Left(call_deadline_).count() <= 0)
      continue;  // the caller's deadline, above
    if (silent) {
      timed_out_ = true;
      return Status::Unavailable("peer " + address_ + " said nothing for " + std::to_string(io_timeout_.count()) +
                                 " ms (peer_timeout_ms)");
    }
    if (r < 0) return Status::Unavailable("receive from peer " + address_ + ": " + std::strerror(errno));
    p += r;
    n -= static_cast<size_t>(r);
  }
  return Status::OK();
}

Status PeerLink::WaitReadable() {
  pollfd p{fd_, POLLIN, 0};
  int rc;
  while ((rc = poll(&p, 1, -1)) < 0 && errno == EINTR) {
  }
  if (rc < 0) return Status::FromErrno(errno, "poll on peer " + address_);
  return Status::OK();
}

Status PeerLink::Discard(uint64_t n) {
  std::vector<char> sink(static_cast<size_t>(std::min<uint64_t>(n, 1 << 20)));
  Status s;
  for (uint64_t left = n; s.ok() && left > 0;) {
    const size_t chunk = static_cast<size_t>(std::min<uint64_t>(left, sink.size()));
    s = RecvAll(sink.data(), chunk);
    left -= chunk;
  }
  return s;
}

Status PeerLink::Send(const google::protobuf::MessageLite& m) {
  std::string body;
  if (!m.SerializeToString(&body)) return Status::Internal("cannot serialise a peer message");
  unsigned char len[4];
  const uint32_t n = static_cast<uint32_t>(body.size());
  for (int i = 0; i < 4; ++i) len[i] = static_cast<unsigned char>(n >> (8 * i));
  body.insert(0, reinterpret_cast<char*>(len), 4);
  return SendAll(body.data(), body.size());
}

Status PeerLink::Recv(google::protobuf::MessageLite* m) {
  unsigned char len[4];
  Status s = RecvAll(len, 4);
  if (!s.ok()) return s;
  const uint32_t n = len[0] | (len[1] << 8) | (len[2] << 16) | (static_cast<uint32_t>(len[3]) << 24);
  const uint32_t limit = authenticated_ ? kMaxMessage : kMaxHandshakeMessage;
  if (n > limit)
    return Status::InvalidArgument("peer " + address_ + " sent a " + std::to_string(n) +
                                   "-byte message (at most " + std::to_string(limit) +
                                   (authenticated_ ? ")" : " before authentication)"));
  // The buffer grows with the bytes that really arrive, never with the prefix.
  constexpr size_t kStep = 1 << 20;
  std::string body;
  while (body.size() < n) {
    const size_t have = body.size();
    const size_t chunk = std::min<size_t>(n - have, have == 0 ? kStep : have);
    body.resize(have + chunk);
    if (!(s = RecvAll(&body[have], chunk)).ok()) return s;
  }
  if (!m->ParseFromString(body)) return Status::InvalidArgument("peer " + address_ + " sent an unreadable message");
  return Status::OK();
}

}  // namespace tce
