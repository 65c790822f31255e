#include <sys/mman.h>
#include <sys/sendfile.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <string>

#include "ring/transport.h"

namespace tce {
namespace {

class TcpTransport final : public Transport {
 public:
  const char* name() const override { return "tcp"; }

  Status Send(PeerLink* link, const SendSource& src, const ChunkFn& before) override {
    for (uint64_t from = 0; from < src.size; from += kTransferChunk) {
      const uint64_t n = std::min(kTransferChunk, src.size - from);
      if (before) before(from, n);
      off_t offset = static_cast<off_t>(from);
      while (static_cast<uint64_t>(offset) < from + n) {
        ssize_t sent = sendfile(link->fd(), src.fd, &offset, static_cast<size_t>(from + n - offset));
        if (sent < 0 && errno == EINTR) continue;
        if (sent <= 0)
          return Status::Unavailable("sendfile to peer " + link->peer() + ": " +
                                     (sent == 0 ? std::string("end of buffer") : std::strerror(errno)));
      }
    }
    return Status::OK();
  }

  Status Recv(PeerLink* link, unsigned char* dst, uint64_t size, const ChunkFn& landed) override {
    for (uint64_t off = 0; off < size; off += kTransferChunk) {
      const uint64_t n = std::min(kTransferChunk, size - off);
      Status s = link->RecvAll(dst + off, static_cast<size_t>(n));
      if (!s.ok()) return s;
      if (landed) landed(off, n);
    }
    return Status::OK();
  }

  Status Refuse(PeerLink* link, uint64_t size, const Status&) override {
    return link->Discard(size);  // the sender sends regardless: drain to stay in step
  }
};

// A corrupted copy of the source in a memfd of its own, sent by `inner`.
class CorruptingTransport final : public Transport {
 public:
  explicit CorruptingTransport(std::unique_ptr<Transport> inner) : inner_(std::move(inner)) {}
  const char* name() const override { return inner_->name(); }

  Status Send(PeerLink* link, const SendSource& src, const ChunkFn& before) override {
    if (src.size == 0) return inner_->Send(link, src, before);
    int fd = memfd_create("tce-corrupt", MFD_CLOEXEC);
    if (fd < 0) return Status::FromErrno(errno, "memfd_create");
    Status s;
    if (ftruncate(fd, static_cast<off_t>(src.size)) != 0) s = Status::FromErrno(errno, "ftruncate");
    void* to = s.ok() ? mmap(nullptr, src.size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0) : MAP_FAILED;
    void* from = s.ok() ? mmap(nullptr, src.size, PROT_READ, MAP_SHARED, src.fd, 0) : MAP_FAILED;
    if (s.ok() && (to == MAP_FAILED || from == MAP_FAILED)) s = Status::FromErrno(errno, "mmap");
    if (s.ok()) {
      std::memcpy(to, from, src.size);
      static_cast<unsigned char*>(to)[src.size / 2] ^= 0x5a;
      s = inner_->Send(link, SendSource{fd, src.size}, before);
    }
    if (to != MAP_FAILED) munmap(to, src.size);
    if (from != MAP_FAILED) munmap(from, src.size);
    ::close(fd);
    return s;
  }

  Status Recv(PeerLink* link, unsigned char* dst, uint64_t size, const ChunkFn& landed) override {
    return inner_->Recv(link, dst, size, landed);
  }
  Status Refuse(PeerLink* link, uint64_t size, const Status& why) override {
    return inner_->Refuse(link, size, why);
  }

 private:
  std::unique_ptr<Transport> inner_;
};

}  // namespace

std::unique_ptr<Transport> NewCorruptingTransport(std::unique_ptr<Transport> inner) {
  return std::make_unique<CorruptingTransport>(std::move(inner));
}

std::unique_ptr<Transport> NewTcpTransport() { return std::make_unique<TcpTransport>(); }

Status NewTransport(const TransportOptions& o, std::unique_ptr<Transport>* out) {
  if (o.name == "tcp") {
    *out = NewTcpTransport();
    return Status::OK();
  }
  if (o.name == "ofi") return NewOfiTransport(o, out);
  return Status::InvalidArgument("unknown ring transport '" + o.name + "' (tcp, ofi)");
}

}  // namespace tce
