#include "ring/corrupting_transport.h"

#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <utility>

namespace tce {
namespace {

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

  Status Recv(PeerLink* link, const RecvDest& dst, uint64_t size, const LandedFn& landed) override {
    return inner_->Recv(link, dst, size, landed);
  }
  Status Refuse(PeerLink* link, uint64_t size, const Status& why) override {
    return inner_->Refuse(link, size, why);
  }
  int lanes() const override { return inner_->lanes(); }

 private:
  std::unique_ptr<Transport> inner_;
};

}  // namespace

std::unique_ptr<Transport> NewCorruptingTransport(std::unique_ptr<Transport> inner) {
  return std::make_unique<CorruptingTransport>(std::move(inner));
}

}  // namespace tce
