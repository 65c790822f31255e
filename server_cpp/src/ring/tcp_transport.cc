#include "ring/tcp_transport.h"

#include <algorithm>
#include <functional>
#include <memory>
#include <string>
#include <system_error>
#include <thread>
#include <vector>

#include "cache/buffer.h"
#include "common/mutex.h"

namespace tce {
namespace {

// A transfer spread over the lanes of a link: chunk c travels on lane
// c % lanes, each lane on a thread of its own, so that several streams fill
// a link that one stream cannot. The calling thread keeps the order the
// ChunkFns promise: the sender's `before` runs on it and releases each chunk
// to its lane; the receiver's `landed` runs on it as the landed prefix grows.
// The first error breaks every lane, so no thread stays blocked.
class Striped {
 public:
  Striped(PeerLink* link, uint64_t size)
      : link_(link), size_(size), chunks_((size + kTransferChunk - 1) / kTransferChunk), done_(chunks_) {}

  // Runs move(lane, offset, n) for every chunk, on the chunk's lane thread;
  // with `before`, a chunk moves once `before` has run for it.
  Status Send(const ChunkFn& before, const std::function<Status(PeerLink*, uint64_t, uint64_t)>& move) {
    uint64_t released = before ? 0 : chunks_;
    std::vector<std::thread> lanes;
    for (size_t j = 0; j < link_->lanes(); ++j)
      StartLane(&lanes, [&, j] {
        for (uint64_t c = j; c < chunks_; c += link_->lanes()) {
          {
            MutexLock l(&mu_);
            while (released <= c && error_.ok()) cv_.Wait(&mu_);
            if (!error_.ok()) return;
          }
          Status s = move(link_->lane(j), Offset(c), Size(c));
          if (!s.ok()) return Fail(s);
        }
      });
    for (uint64_t c = 0; before && c < chunks_; ++c) {
      before(Offset(c), Size(c));
      MutexLock l(&mu_);
      if (!error_.ok()) break;
      released = c + 1;
      cv_.SignalAll();
    }
    return Join(&lanes);
  }

  // Runs move(lane index, lane, offset, n, &data) for every chunk on its
  // lane thread, and `landed` here for each chunk in order once it has
  // moved, with the `data` its move set. With `hold`, data is the lane's
  // own buffer: the lane waits for `landed` to be done with a chunk before
  // it moves its next one.
  using Move = std::function<Status(size_t j, PeerLink*, uint64_t, uint64_t, const unsigned char** data)>;
  Status Recv(const LandedFn& landed, bool hold, const Move& move) {
    hold = hold && landed;
    std::vector<const unsigned char*> data(chunks_, nullptr);
    std::vector<std::thread> lanes;
    for (size_t j = 0; j < link_->lanes(); ++j)
      StartLane(&lanes, [&, j] {
        for (uint64_t c = j; c < chunks_; c += link_->lanes()) {
          const unsigned char* at = nullptr;
          Status s = move(j, link_->lane(j), Offset(c), Size(c), &at);
          if (!s.ok()) return Fail(s);
          MutexLock l(&mu_);
          data[c] = at;
          done_[c] = true;
          cv_.SignalAll();
          while (hold && landed_ <= c && error_.ok()) cv_.Wait(&mu_);
          if (!error_.ok()) return;
        }
      });
    for (uint64_t c = 0; landed && c < chunks_; ++c) {
      const unsigned char* at;
      {
        MutexLock l(&mu_);
        while (!done_[c] && error_.ok()) cv_.Wait(&mu_);
        if (!error_.ok()) break;
        at = data[c];
      }
      landed(Offset(c), Size(c), at);
      MutexLock l(&mu_);
      landed_ = c + 1;
      cv_.SignalAll();
    }
    return Join(&lanes);
  }

 private:
  uint64_t Offset(uint64_t c) const { return c * kTransferChunk; }
  uint64_t Size(uint64_t c) const { return std::min(kTransferChunk, size_ - Offset(c)); }

  // Starts `lane` on a thread of its own; when no thread can start (a pids
  // limit), the transfer fails instead of the process (the link breaks, so
  // the lanes that did start end too).
  template <typename F>
  void StartLane(std::vector<std::thread>* lanes, F&& lane) {
    try {
      lanes->emplace_back(std::forward<F>(lane));
    } catch (const std::system_error& e) {
      Fail(Status::ResourceExhausted(std::string("cannot start a lane thread: ") + e.what()));
    }
  }

  void Fail(const Status& s) {
    MutexLock l(&mu_);
    if (error_.ok()) {
      error_ = s;
      link_->Break();
    }
    cv_.SignalAll();
  }

  Status Join(std::vector<std::thread>* lanes) {
    for (auto& t : *lanes) t.join();
    MutexLock l(&mu_);
    return error_;
  }

  PeerLink* const link_;
  const uint64_t size_, chunks_;
  Mutex mu_;
  CondVar cv_;
  std::vector<bool> done_ GUARDED_BY(mu_);
  uint64_t landed_ GUARDED_BY(mu_) = 0;  // chunks `landed` is done with
  Status error_ GUARDED_BY(mu_);
};

class TcpTransport final : public Transport {
 public:
  explicit TcpTransport(int streams) : streams_(streams) {}
  const char* name() const override { return "tcp"; }
  int lanes() const override { return streams_; }

  Status Send(PeerLink* link, const SendSource& src, const ChunkFn& before) override {
    auto move = [&](PeerLink* lane, uint64_t off, uint64_t n) { return lane->SendFile(src.fd, off, n); };
    if (Striping(link, src.size)) return Striped(link, src.size).Send(before, move);
    for (uint64_t off = 0; off < src.size; off += kTransferChunk) {
      const uint64_t n = std::min(kTransferChunk, src.size - off);
      if (before) before(off, n);
      Status s = move(link, off, n);
      if (!s.ok()) return s;
    }
    return Status::OK();
  }

  Status Recv(PeerLink* link, const RecvDest& dst, uint64_t size, const LandedFn& landed) override {
    const bool through = dst.fd >= 0;  // the bytes go through a buffer of our own into the memfd
    if (Striping(link, size)) {
      // A chunk per lane (not zero-filled: only what a chunk fills is touched).
      std::vector<std::unique_ptr<unsigned char[]>> own;
      for (size_t j = 0; through && j < link->lanes(); ++j)
        own.emplace_back(new unsigned char[std::min(kTransferChunk, size)]);
      return Striped(link, size).Recv(landed, through, [&](size_t j, PeerLink* lane, uint64_t off, uint64_t n,
                                                          const unsigned char** data) {
        *data = through ? own[j].get() : dst.map + off;
        return Land(lane, dst, off, n, through ? own[j].get() : nullptr);
      });
    }
    std::unique_ptr<unsigned char[]> own(through && size > 0 ? new unsigned char[std::min(kPiece, size)] : nullptr);
    for (uint64_t off = 0; off < size;) {
      const uint64_t n = std::min(through ? kPiece : kTransferChunk, size - off);
      Status s = Land(link, dst, off, n, own.get());
      if (!s.ok()) return s;
      if (landed) landed(off, n, through ? own.get() : dst.map + off);
      off += n;
    }
    return Status::OK();
  }

  Status Refuse(PeerLink* link, uint64_t size, const Status&) override {
    // The sender sends regardless: drain every lane to stay in step.
    if (!Striping(link, size)) return link->Discard(size);
    return Striped(link, size).Recv(nullptr, false, [](size_t, PeerLink* lane, uint64_t, uint64_t n,
                                                       const unsigned char**) { return lane->Discard(n); });
  }

 private:
  // Both ends decide alike: the link's lanes and the size are all they use.
  static bool Striping(PeerLink* link, uint64_t size) { return link->lanes() > 1 && size > kTransferChunk; }

  // Without lanes, what a receive takes from the socket at a time on its way
  // into a memfd: small enough to stay in the CPU's cache until written.
  static constexpr uint64_t kPiece = 256 << 10;

  // Bytes [off, off + n) of a transfer from `lane`: into the mapping, or
  // into `own` (n bytes at least) and from there into the memfd.
  static Status Land(PeerLink* lane, const RecvDest& dst, uint64_t off, uint64_t n, unsigned char* own) {
    if (dst.fd < 0) return lane->RecvAll(dst.map + off, static_cast<size_t>(n));
    Status s = lane->RecvAll(own, static_cast<size_t>(n));
    return s.ok() ? Buffer::WriteAt(dst.fd, off, own, static_cast<size_t>(n), "a received buffer") : s;
  }

  const int streams_;
};

}  // namespace

std::unique_ptr<Transport> NewTcpTransport(int streams) { return std::make_unique<TcpTransport>(std::max(1, streams)); }

}  // namespace tce
