#include "cache/buffer_pool.h"

#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <iterator>
#include <limits>
#include <vector>

#include "cache/buffer.h"
#include "common/logging.h"
#include "common/strings.h"

namespace tce {
namespace {

constexpr int kFillerNice = 10;
constexpr auto kRetry = std::chrono::seconds(1);  // after the budget or the kernel said no

}  // namespace

BufferPool::BufferPool(uint64_t target, Backing backing, PoolBudget* budget, uint64_t max_piece, Clock* clock)
    : target_(backing == Backing::kHugetlb ? target / kHugePage * kHugePage : target),
      backing_(backing), budget_(budget), clock_(clock), max_piece_(max_piece),
      // Half the target first: a file takes the piece nearest its size, and a
      // file larger than any piece grows the largest (only the growth is zeroed).
      next_piece_(std::max<uint64_t>(std::min(max_piece, target_ / 2), kHugePage)) {}

BufferPool::~BufferPool() { Stop(); }

void BufferPool::Start() {
  MutexLock lock(&mu_);
  if (filler_.joinable() || stop_ || target_ == 0) return;
  filling_ = true;
  filler_ = std::thread([this] { Fill(); });
}

void BufferPool::Stop() {
  {
    MutexLock lock(&mu_);
    stop_ = true;
  }
  wake_.SignalAll();
  if (filler_.joinable()) filler_.join();
  Shed(UINT64_MAX);
}

void BufferPool::Fill() {
  // Filling competes with training for CPU and memory bandwidth: it yields.
  if (setpriority(PRIO_PROCESS, static_cast<id_t>(syscall(SYS_gettid)), kFillerNice) != 0)
    TCE_LOG(kWarning, "cache") << "pool: setpriority: " << std::strerror(errno);
  TCE_LOG(kInfo, "cache") << "pool: pre-faulting " << HumanBytes(target_) << " of "
                          << BackingName(backing_) << " memory in the background";
  bool warned = false, announced = false;
  MutexLock lock(&mu_);
  while (!stop_) {
    const uint64_t want = target_ > held_ ? target_ - held_ : 0;
    uint64_t size = std::min(want, next_piece_);
    if (backing_ == Backing::kHugetlb) size = size / kHugePage * kHugePage;
    Status s = Status::NotFound("nothing to do");
    int fd = -1;
    if (size > 0) {
      const bool reshape = learned_;
      lock.Unlock();
      bool room = budget_->ReservePool(size);
      // Pieces smaller than the files taken serve them only by growing (each
      // growth zero-filled on the save's path): trade them for one that fits.
      if (!room && reshape && ShedBelow(size, size) >= size) room = budget_->ReservePool(size);
      if (room) {
        s = MakePiece(size, &fd);
        if (!s.ok()) budget_->ReturnPool(size);
      } else {
        s = Status::ResourceExhausted("the memory budget is in use");
      }
      lock.Lock();
    }
    if (s.ok()) {
      pieces_.emplace(size, fd);
      held_ += size;
      filled_ += size;
      resting_ = false;
      if (!learned_) next_piece_ = std::max(next_piece_ / 2, std::min(max_piece_ / 16, size));
      warned = false;
      continue;
    }
    if (size > 0 && !warned && s.code() != Status::Code::kResourceExhausted) {
      TCE_LOG(kWarning, "cache") << "pool: cannot pre-fault " << HumanBytes(size) << ": " << s.ToString();
      warned = true;
    }
    if (size == 0 && !announced) {
      TCE_LOG(kInfo, "cache") << "pool: " << HumanBytes(held_) << " pre-faulted";
      announced = true;
    }
    if (size > 0) announced = false;
    filling_ = false;
    resting_ = true;
    idle_.SignalAll();
    clock_->WaitUntil(&wake_, &mu_, clock_->Now() + kRetry);
    filling_ = true;
  }
  filling_ = false;
  resting_ = true;
  idle_.SignalAll();
}

Status BufferPool::MakePiece(uint64_t size, int* fd) {
  // In slices, so that Stop() never waits long for a yielding filler.
  constexpr std::chrono::milliseconds kSlice{100};
  std::chrono::milliseconds yielded{0};
  auto yield = [&] {
    while (yielded < kMaxYield) {
      {
        MutexLock lock(&mu_);
        if (stop_) return;
      }
      const auto slice = std::min(kSlice, kMaxYield - yielded);
      const auto waited = budget_->WaitForNoSaves(slice);
      yielded += waited;
      if (waited < slice) return;  // no save in flight now
    }
  };
  yield();
  uint64_t done = std::min(size, kStep);
  Status s = Buffer::Prefault(done, backing_, fd);
  while (s.ok() && done < size) {
    yield();
    const uint64_t to = std::min(size, done + kStep);
    s = Buffer::Resize(*fd, done, to, backing_);
    done = to;
  }
  if (!s.ok() && *fd >= 0) {
    ::close(*fd);
    *fd = -1;
  }
  return s;
}

Status BufferPool::Take(uint64_t capacity, int* fd) {
  int piece = -1;
  uint64_t size = 0;
  {
    MutexLock lock(&mu_);
    if (pieces_.empty()) {
      ++missed_;
      return Status::NotFound("the pool is empty");
    }
    auto it = pieces_.lower_bound(capacity);
    if (it == pieces_.end()) it = std::prev(pieces_.end());
    size = it->first;
    piece = it->second;
    pieces_.erase(it);
    held_ -= size;
    ++taken_;
    resting_ = false;  // there is room to fill again
    // The next file is likely shaped like this one (the next rank's, the next checkpoint's).
    next_piece_ = std::max<uint64_t>(std::min(RoundForBacking(capacity, backing_), max_piece_), kHugePage);
    learned_ = true;
  }
  wake_.SignalAll();
  budget_->ReturnPool(size);
  Status s = Buffer::Resize(piece, size, capacity, backing_);
  if (!s.ok()) {
    ::close(piece);
    return s;
  }
  *fd = piece;
  return Status::OK();
}

uint64_t BufferPool::Shed(uint64_t bytes) {
  return ShedBelow(std::numeric_limits<uint64_t>::max(), bytes, /*all_or_none=*/false);
}

uint64_t BufferPool::ShedBelow(uint64_t size, uint64_t need, bool all_or_none) {
  std::vector<int> fds;
  uint64_t freed = 0;
  {
    MutexLock lock(&mu_);
    if (all_or_none) {
      uint64_t small = 0;
      for (auto it = pieces_.begin(); it != pieces_.end() && it->first < size; ++it) small += it->first;
      if (small < need) return 0;  // not enough to trade: keep them
    }
    while (freed < need && !pieces_.empty() && pieces_.begin()->first < size) {
      freed += pieces_.begin()->first;
      fds.push_back(pieces_.begin()->second);
      pieces_.erase(pieces_.begin());
    }
    held_ -= freed;
  }
  for (int fd : fds) ::close(fd);
  if (freed) budget_->ReturnPool(freed);
  return freed;
}

bool BufferPool::WaitIdle(int timeout_ms) {
  const auto deadline = clock_->Now() + std::chrono::milliseconds(timeout_ms);
  MutexLock lock(&mu_);
  while (!resting_ && clock_->WaitUntil(&idle_, &mu_, deadline)) {
  }
  return resting_;
}

PoolStats BufferPool::Stats() {
  MutexLock lock(&mu_);
  PoolStats s;
  s.target = target_;
  s.held = held_;
  s.pieces = pieces_.size();
  s.filled = filled_;
  s.taken = taken_;
  s.missed = missed_;
  s.filling = filling_;
  return s;
}

}  // namespace tce
