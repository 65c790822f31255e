#include <sys/sendfile.h>

#include <unistd.h>

#include <cerrno>
#include <string>
#include <cstring>

#include "ring/transport.h"

namespace tce {
namespace {

class TcpTransport final : public Transport {
 public:
  const char* name() const override { return "tcp"; }

  Status SendData(PeerLink* link, int fd, uint64_t from, uint64_t size) override {
    off_t offset = static_cast<off_t>(from);
    const uint64_t end = from + size;
    while (static_cast<uint64_t>(offset) < end) {
      const size_t chunk = static_cast<size_t>(std::min<uint64_t>(end - offset, 1 << 30));
      ssize_t n = sendfile(link->fd(), fd, &offset, chunk);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0)
        return Status::Unavailable("sendfile to peer " + link->peer() + ": " +
                                   (n == 0 ? std::string("end of buffer") : std::strerror(errno)));
    }
    return Status::OK();
  }

  Status RecvData(PeerLink* link, unsigned char* dst, int, uint64_t size) override {
    return link->RecvAll(dst, static_cast<size_t>(size));
  }
};

class CorruptingTransport final : public Transport {
 public:
  explicit CorruptingTransport(std::unique_ptr<Transport> inner) : inner_(std::move(inner)) {}
  const char* name() const override { return inner_->name(); }

  Status SendData(PeerLink* link, int fd, uint64_t from, uint64_t size) override {
    std::string bytes(static_cast<size_t>(size), '\0');
    for (uint64_t off = 0; off < size;) {
      ssize_t n = pread(fd, &bytes[off], static_cast<size_t>(size - off), static_cast<off_t>(from + off));
      if (n <= 0) return Status::FromErrno(errno, "read buffer");
      off += static_cast<uint64_t>(n);
    }
    if (size > 0) bytes[size / 2] ^= 0x5a;
    return link->SendAll(bytes.data(), bytes.size());
  }

  Status RecvData(PeerLink* link, unsigned char* dst, int fd, uint64_t size) override {
    return inner_->RecvData(link, dst, fd, size);
  }

 private:
  std::unique_ptr<Transport> inner_;
};

}  // namespace

std::unique_ptr<Transport> NewCorruptingTransport(std::unique_ptr<Transport> inner) {
  return std::make_unique<CorruptingTransport>(std::move(inner));
}

std::unique_ptr<Transport> NewTcpTransport() { return std::make_unique<TcpTransport>(); }

Status NewTransport(const std::string& name, std::unique_ptr<Transport>* out) {
  if (name == "tcp") {
    *out = NewTcpTransport();
    return Status::OK();
  }
  return Status::InvalidArgument("unknown ring transport '" + name + "' (tcp)");
}

}  // namespace tce
