#include "rpc/range_buffers.h"

#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>

namespace tce {

RangeBuffers::Held::~Held() {
  if (map) munmap(map, buffer->capacity());
}

Status RangeBuffers::Fd(const std::string& session, int* fd, uint64_t* capacity) {
  MutexLock l(&mu_);
  std::shared_ptr<Held>& b = buffers_[session];
  if (!b) {
    auto made = std::make_shared<Held>();
    Status s = buffers_.size() > kMax
                   ? Status::ResourceExhausted(std::to_string(kMax) +
                                               " clients hold a range buffer already")
                   : Buffer::Create(next_id_++, kSize, &made->buffer);
    if (s.ok()) {
      void* m = mmap(nullptr, kSize, PROT_READ | PROT_WRITE, MAP_SHARED, made->buffer->fd(), 0);
      if (m == MAP_FAILED) s = Status::FromErrno(errno, "mmap a range buffer");
      else made->map = static_cast<unsigned char*>(m);
    }
    if (!s.ok()) {
      buffers_.erase(session);
      return s;
    }
    b = std::move(made);
  }
  *capacity = kSize;
  return b->buffer->NewFd(/*writable=*/false, fd);
}

Status RangeBuffers::Place(const std::string& session, uint64_t offset, uint64_t length,
                           std::shared_ptr<Held>* hold, unsigned char** at) {
  {
    MutexLock l(&mu_);
    auto it = buffers_.find(session);
    if (it == buffers_.end())
      return Status::FromCode(Status::Code::kFailedPrecondition,
                              "this session has no range buffer (the fd socket gives one)");
    *hold = it->second;
  }
  if (offset > kSize || length > kSize - offset)  // never offset + length: it may wrap
    return Status::FromCode(Status::Code::kOutOfRange,
                            "bytes [" + std::to_string(offset) + ", +" + std::to_string(length) +
                                ") are not inside the range buffer's " + std::to_string(kSize));
  *at = (*hold)->map + offset;
  return Status::OK();
}

void RangeBuffers::Drop(const std::string& session) {
  std::shared_ptr<Held> last;  // freed outside the lock (or by the last ReadRange using it)
  MutexLock l(&mu_);
  auto it = buffers_.find(session);
  if (it == buffers_.end()) return;
  last = std::move(it->second);
  buffers_.erase(it);
}

size_t RangeBuffers::size() const {
  MutexLock l(&mu_);
  return buffers_.size();
}

}  // namespace tce
