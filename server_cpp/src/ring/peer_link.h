// PeerLink: one authenticated TCP connection between two tce-servers.
//
// Both sides prove they know the cluster token without sending it: each
// sends a random nonce, and each answers the other's nonce with
// HMAC-SHA256(token, role || nonce), the role byte differing per direction so
// that a proof cannot be reflected back. A peer that fails is refused (and
// the caller logs it). Messages are length-prefixed protobufs; sends and
// receives time out, so a dead peer or a cut link ends in an error, never a
// hang. Not thread-safe: one thread uses a link at a time.
#pragma once

#include <google/protobuf/message_lite.h>

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "common/net.h"
#include "common/status.h"

namespace tce {

class PeerLink {
 public:
  ~PeerLink();
  PeerLink(const PeerLink&) = delete;
  PeerLink& operator=(const PeerLink&) = delete;

  // Connects to "host:port" and authenticates. `self` is our own endpoint.
  static Status Connect(const std::string& endpoint, const std::string& self,
                        const std::string& token, std::chrono::milliseconds timeout,
                        std::unique_ptr<PeerLink>* out);
  // Authenticates an accepted socket (takes ownership of `fd`, closed on failure).
  static Status Accept(int fd, const std::string& self, const std::string& token,
                       std::chrono::milliseconds timeout, std::unique_ptr<PeerLink>* out);

  Status Send(const google::protobuf::MessageLite& m);
  Status Recv(google::protobuf::MessageLite* m);
  // Raw bytes (the data path of the tcp transport).
  Status SendAll(const void* data, size_t n);
  Status RecvAll(void* data, size_t n);
  // Blocks, without the I/O timeout, until a message (or the end) arrives.
  Status WaitReadable();
  // Receives and throws away `n` bytes (data that has nowhere to go).
  Status Discard(uint64_t n);

  int fd() const { return fd_; }
  const std::string& peer() const { return peer_; }  // the endpoint the peer announced

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
  PeerLink(int fd, std::string address) : fd_(fd), address_(std::move(address)) {}
  Status Handshake(bool connecting, const std::string& self, const std::string& token);

  const int fd_;
  const std::string address_;  // the socket's remote address, for messages
  std::string peer_;
  std::vector<std::unique_ptr<PeerLink>> lanes_;
};

constexpr int kMaxLanes = 16;

// Gives `link` (connected to `endpoint`) `count - 1` lanes: connects and
// authenticates them, and has the peer bind them to its end of the link.
Status OpenLanes(PeerLink* link, const std::string& endpoint, const std::string& self,
                 const std::string& token, std::chrono::milliseconds timeout, int count);

}  // namespace tce
