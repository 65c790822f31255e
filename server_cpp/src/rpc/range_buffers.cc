#include "rpc/range_buffers.h"

#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>

#include "common/strings.h"

namespace tce {

RangeBuffers::Held::~Held() {
  if (map) munmap(map, buffer->capacity());
  buffer.reset();  // its pages are punched out here, whoever still holds its fd
  if (budget) budget->GiveBack(kSize);
}

RangeBuffers::RangeBuffers(MemoryBudget* budget, size_t max_per_uid)
    : budget_(budget), per_uid_(max_per_uid, "range buffers", "max_range_buffers_per_uid") {}

Status RangeBuffers::Make(std::shared_ptr<Held>* out) {
  if (!budget_->Borrow(kSize))
    return Status::ResourceExhausted("no room in the memory budget (memory_budget) for a range buffer of " +
                                     HumanBytes(kSize));
  auto made = std::make_shared<Held>();
  made->budget = budget_;
  Status s = Buffer::Create(next_id_++, kSize, &made->buffer);
  if (!s.ok()) return s;  // (made gives the bytes back)
  void* m = mmap(nullptr, kSize, PROT_READ | PROT_WRITE, MAP_SHARED, made->buffer->fd(), 0);
  if (m == MAP_FAILED) return Status::FromErrno(errno, "mmap a range buffer");
  made->map = static_cast<unsigned char*>(m);
  *out = std::move(made);
  return Status::OK();
}

Status RangeBuffers::Fd(const std::string& session, uid_t uid, int* fd, uint64_t* capacity) {
  MutexLock l(&mu_);
  auto it = buffers_.find(session);
  if (it == buffers_.end()) {
    if (buffers_.size() >= kMax)
      return Status::ResourceExhausted(std::to_string(kMax) + " clients hold a range buffer already");
    Status s = per_uid_.Take(uid);
    std::shared_ptr<Held> made;
    if (s.ok()) {
      s = Make(&made);
      if (!s.ok()) per_uid_.Give(uid);
    }
    if (!s.ok()) return s;
    it = buffers_.emplace(session, Entry{std::move(made), uid}).first;
  }
  *capacity = kSize;
  return it->second.held->buffer->NewFd(/*writable=*/false, fd);
}

Status RangeBuffers::Place(const std::string& session, uint64_t offset, uint64_t length,
                           std::shared_ptr<Held>* hold, unsigned char** at) {
  {
    MutexLock l(&mu_);
    auto it = buffers_.find(session);
    if (it == buffers_.end())
      return Status::FromCode(Status::Code::kFailedPrecondition,
                              "this session has no range buffer (the fd socket gives one)");
    *hold = it->second.held;
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
  last = std::move(it->second.held);
  per_uid_.Give(it->second.uid);
  buffers_.erase(it);
}

size_t RangeBuffers::size() const {
  MutexLock l(&mu_);
  return buffers_.size();
}

}  // namespace tce
