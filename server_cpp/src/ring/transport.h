// Transport: how a file's bytes move between two servers of the ring. The
// control messages always travel on the PeerLink; only the bulk data path
// differs per transport:
//   tcp: sendfile() from the sender's memfd into the socket (no copy in user
//        space), recv() straight into the receiver's mapped buffer; with
//        several streams, 2 MiB chunks striped over that many connections.
//   ofi: libfabric RMA writes into the receiver's buffer, registered for that
//        one transfer; the link carries the registration and the progress.
// Both move a transfer in chunks of kTransferChunk and tell the caller about
// each one (the sender just before it goes, the receiver once it has landed),
// so checksums run while the chunk is cache-hot and overlap the transfer.
// Implementations are thread-safe; a link is used by one thread at a time.
// They come from NewTransport (ring/transport_factory.h).
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "common/status.h"
#include "ring/peer_link.h"

namespace tce {

constexpr uint64_t kTransferChunk = 2 << 20;

// (offset, size) of one chunk of a transfer.
using ChunkFn = std::function<void(uint64_t offset, uint64_t n)>;
// (offset, size, bytes) of a piece of a transfer that landed; the bytes are
// the receiver's to read during the call only.
using LandedFn = std::function<void(uint64_t offset, uint64_t n, const unsigned char* data)>;

// Where a receiver puts the bytes: `map`, a writable mapping of a buffer,
// and `fd`, that buffer's memfd (-1: none; hugetlbfs has no write(2)). A
// transport that copies the bytes out of a socket writes them to the memfd
// (pwrite through a small buffer: about half the CPU of faulting in new
// shmem pages of the mapping); one whose data path writes memory (RDMA)
// writes the mapping.
struct RecvDest {
  unsigned char* map = nullptr;
  int fd = -1;
};

// What a sender sends: bytes [0, size) of memfd `fd`.
struct SendSource {
  int fd = -1;
  uint64_t size = 0;
};

class Transport {
 public:
  virtual ~Transport() = default;
  virtual const char* name() const = 0;
  // Sender: moves all of `src` to the peer. `before` (may be empty) runs just
  // before each chunk goes, in order.
  virtual Status Send(PeerLink* link, const SendSource& src, const ChunkFn& before) = 0;
  // Receiver: places the `size` bytes the peer sends in `dst`. `landed` (may
  // be empty) runs on the calling thread as the bytes arrive, in order, each
  // byte once.
  virtual Status Recv(PeerLink* link, const RecvDest& dst, uint64_t size, const LandedFn& landed) = 0;
  // Receiver with nowhere to put the bytes: refuses or drains them, so the
  // link stays usable or is reported broken (UNAVAILABLE). `why` is sent to
  // the sender where the transport can say it.
  virtual Status Refuse(PeerLink* link, uint64_t size, const Status& why) = 0;
  // Connections per link the transport moves data on (OpenLanes gives a new
  // link the extra ones); 1 for a transport with a data path of its own.
  virtual int lanes() const { return 1; }
};

// What NewTransport (ring/transport_factory.h) is given: the transport to
// make and each transport's own settings.
struct TransportOptions {
  std::string name = "tcp";       // tcp | ofi
  int streams = 1;                // tcp: connections per link (chunks striped over them)
  std::string ofi_provider;       // ofi: libfabric provider ("" = any with RMA)
  std::string ofi_devices;        // ofi: device filter (TCE_RDMA_DEVICES/NCCL_IB_HCA syntax)
  std::string source_host;        // ofi without a filter: the device that owns this address
  std::chrono::milliseconds io_timeout{30000};
};

}  // namespace tce
