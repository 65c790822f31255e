// Transport: how a file's bytes move between two servers of the ring. The
// control messages always travel on the PeerLink; only the bulk data path
// differs per transport:
//   tcp: sendfile() from the sender's memfd into the socket (no copy in user
//        space), recv() straight into the receiver's mapped buffer.
//   ofi: libfabric RMA writes into the receiver's registered buffer (to come).
// Implementations are stateless per call and thread-safe.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "common/status.h"
#include "ring/peer_link.h"

namespace tce {

class Transport {
 public:
  virtual ~Transport() = default;
  virtual const char* name() const = 0;
  // Sender: moves bytes [offset, offset + size) of memfd `fd` to the peer.
  // A transfer may be sent in several calls, in order.
  virtual Status SendData(PeerLink* link, int fd, uint64_t offset, uint64_t size) = 0;
  // Receiver: places the next `size` bytes the peer sends at `dst` (inside a
  // writable mapping of the receiving buffer, whose memfd is `fd`).
  virtual Status RecvData(PeerLink* link, unsigned char* dst, int fd, uint64_t size) = 0;
};

std::unique_ptr<Transport> NewTcpTransport();

// "tcp" -> the tcp transport; others: a clear error naming the choices.
Status NewTransport(const std::string& name, std::unique_ptr<Transport>* out);

// Fault injection for tests (wire corruption cannot be caused for real: TCP
// checksums it away): wraps `inner` and flips one byte in the middle of
// every transfer it sends.
std::unique_ptr<Transport> NewCorruptingTransport(std::unique_ptr<Transport> inner);

}  // namespace tce
