// PeerLink: one authenticated TCP connection between two tce-servers.
//
// Both sides prove they know the cluster token without sending it (protocol
// 2). The connector sends a hello (its random nonce and its endpoint), the
// acceptor answers with its own; the connector then proves first, and the
// acceptor checks that proof before it proves anything itself. Each proof is
// HMAC-SHA256(token, direction, both nonces, the connector's endpoint, the
// acceptor's endpoint as the connector dialled it), so a proof made for one
// connection is worthless on any other: reflected to its maker, relayed to a
// third server, or replayed later. With node certificates (PeerKey.cert),
// each side then also signs the same transcript with its node's key and
// sends its certificate, which must chain to the cluster CA and name the
// host of the endpoint it announced. A peer that fails is refused (the
// caller logs it).
//
// Before authentication nothing from the peer is trusted: the handshake has
// one deadline for all of it (a slow sender cannot stretch it) and accepts
// messages of at most kMaxHandshakeMessage bytes. Afterwards messages are
// bounded by kMaxMessage, and their buffers grow only as bytes arrive, so a
// length prefix alone allocates nothing. Sends and receives time out, so a
// dead peer or a cut link ends in an error, never a hang. Not thread-safe:
// one thread uses a link at a time.
#pragma once

#include <google/protobuf/message_lite.h>

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "common/clock.h"
#include "common/net.h"
#include "common/status.h"
#include "ring/link_breaker.h"
#include "ring/peer_key.h"

namespace tce {

class PeerLink {
 public:
  ~PeerLink();
  PeerLink(const PeerLink&) = delete;
  PeerLink& operator=(const PeerLink&) = delete;

  // Connects to "host:port" and authenticates (the whole handshake within
  // `timeout`). `self` is our own advertised endpoint; the peer must advertise
  // exactly `endpoint`. With `breaker`, the socket is registered there from
  // before it connects until the link is destroyed (UNAVAILABLE at once when
  // the breaker was broken).
  static Status Connect(const std::string& endpoint, const std::string& self,
                        const PeerKey& key, std::chrono::milliseconds timeout,
                        std::unique_ptr<PeerLink>* out, LinkBreaker* breaker = nullptr);
  // Adopt + AcceptHandshake in one (takes ownership of `fd`, closed on failure).
  static Status Accept(int fd, const std::string& self, const PeerKey& key,
                       std::chrono::milliseconds timeout, std::unique_ptr<PeerLink>* out);
  // An accepted socket, not yet authenticated (takes ownership of `fd`).
  static std::unique_ptr<PeerLink> Adopt(int fd, std::chrono::milliseconds io_timeout);
  // The acceptor's half of the handshake, within `deadline`. `self` is our
  // own advertised endpoint.
  Status AcceptHandshake(const std::string& self, const PeerKey& key,
                         std::chrono::milliseconds deadline);

  Status Send(const google::protobuf::MessageLite& m);
  Status Recv(google::protobuf::MessageLite* m);
  // Raw bytes (the data path of the tcp transport).
  Status SendAll(const void* data, size_t n);
  // Bytes [offset, offset + n) of `fd` (a memfd), with sendfile: no copy in
  // user space; read and sent from a bounce buffer where the fd cannot be
  // spliced (hugetlbfs). UNAVAILABLE when the socket fails or the fd ends early.
  Status SendFile(int fd, uint64_t offset, uint64_t n);
  Status RecvAll(void* data, size_t n);
  // Blocks, without the I/O timeout, until a message (or the end) arrives.
  Status WaitReadable();
  // Receives and throws away `n` bytes (data that has nowhere to go).
  Status Discard(uint64_t n);

  // Until ClearDeadline, every receive on the link and its lanes ends by
  // `deadline` (Clock::Real's time: a caller's own deadline) with
  // DEADLINE_EXCEEDED; each wait is still bounded by the I/O timeout.
  void SetDeadline(Clock::TimePoint deadline);
  void ClearDeadline();
  // The I/O timeout of the link and its lanes from now on.
  void SetIoTimeout(std::chrono::milliseconds timeout);
  // Whether a receive on the link or a lane failed because the peer said
  // nothing within the I/O timeout (it stopped answering; it did not close).
  bool timed_out() const;

  int fd() const { return fd_; }
  const std::string& peer() const { return peer_; }  // the endpoint the peer announced
  const std::string& address() const { return address_; }  // the socket's remote address
  bool authenticated() const { return authenticated_; }

  // Lanes: more connections to the same peer that carry bulk data beside
  // this one (the tcp transport's streams). Lane 0 is this link itself.
  void AddLane(std::unique_ptr<PeerLink> lane) { lanes_.push_back(std::move(lane)); }
  size_t lanes() const { return 1 + lanes_.size(); }
  PeerLink* lane(size_t i) { return i == 0 ? this : lanes_[i - 1].get(); }
  // Shuts down the sockets of every lane: whatever blocks on any of them
  // fails at once. The link is unusable afterwards.
  void Break();
  // Makes closing the link reset every lane, throwing away what is still
  // queued to send: the bytes of a failed attempt never reach the peer later
  // (the kernel would otherwise deliver them once a cut link comes back).
  void Abort();

 private:
  Status SendByReading(int fd, uint64_t offset, uint64_t n);
  PeerLink(int fd, std::string address) : fd_(fd), address_(std::move(address)) {}
  // `dialled`: the endpoint the connector dialled (connector side) or our own
  // advertised endpoint (acceptor side).
  Status Handshake(bool connecting, const std::string& self, const std::string& dialled,
                   const PeerKey& key, std::chrono::milliseconds deadline);
  Status HandshakeSteps(bool connecting, const std::string& self, const std::string& dialled,
                        const PeerKey& key);
  // The certificate step, once both proved the token: each side sends its
  // node certificate and signature, the connector first.
  Status ProveNode(bool connecting, const NodeCert& cert, const std::string& cn, const std::string& an,
                   const std::string& connector, const std::string& acceptor);

  const int fd_;
  LinkBreaker* breaker_ = nullptr;  // where fd_ is registered (optional)
  const std::string address_;  // the socket's remote address, for messages
  std::string peer_;
  bool authenticated_ = false;
  // While set (the handshake), every receive ends by this time.
  Clock::TimePoint deadline_{};
  Clock::TimePoint call_deadline_{};  // SetDeadline's (zero: none)
  bool timed_out_ = false;
  std::chrono::milliseconds io_timeout_{0};
  std::vector<std::unique_ptr<PeerLink>> lanes_;
};

constexpr int kMaxLanes = 16;
constexpr int kPeerProtocolVersion = 2;
constexpr uint32_t kMaxHandshakeMessage = 4096;   // before authentication
constexpr uint32_t kMaxMessage = 64u << 20;        // after: a huge file's record table fits

// The proof one side of a handshake sends (protocol 2): HMAC-SHA256 over the
// direction ('C' from the connector, 'A' from the acceptor), both nonces and
// both endpoints, each length-prefixed. Exposed for tests.
std::string PeerProof(const std::string& token, char direction, const std::string& connector_nonce,
                      const std::string& acceptor_nonce, const std::string& connector_endpoint,
                      const std::string& acceptor_endpoint);

// What a node certificate signs in a handshake (see PeerCertProof): like
// PeerProof's input, under its own label. Exposed for tests.
std::string CertTranscript(char direction, const std::string& connector_nonce, const std::string& acceptor_nonce,
                           const std::string& connector_endpoint, const std::string& acceptor_endpoint);

// Gives `link` (connected to `endpoint`) `count - 1` lanes: connects and
// authenticates them, and has the peer bind them to its end of the link.
Status OpenLanes(PeerLink* link, const std::string& endpoint, const std::string& self,
                 const PeerKey& peer_key, std::chrono::milliseconds timeout, int count,
                 LinkBreaker* breaker = nullptr);

}  // namespace tce
