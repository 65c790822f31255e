// BufferPool: memory reserved and pre-faulted ahead of need, so that a job's
// first save into a new buffer costs what a save into a reused one costs (a
// new memfd zero-fills every page: ~0.3-0.6 s per GiB with 4 KiB pages).
//
// A background thread (nice 10) fills the pool with fresh memfds ("pieces":
// zero-filled, pre-faulted, never handed to anyone) up to `target` bytes, as
// far as the PoolBudget lets it: the Cache counts pooled bytes against its
// memory budget, so the pool never takes memory a cached file needs. The
// pool does not know file sizes: Take() resizes the best piece to the
// capacity asked (shrinking frees the tail; growing pre-faults only the
// missing pages), and the filler refills with pieces the size of recent
// takes. Take() never waits for the filler, so serving never waits for the
// pool; the filler waits for saves in flight (PoolBudget::WaitForNoSaves)
// before each 64 MiB it pre-faults, at most kMaxYield per piece. Every
// piece is fresh memory, so a buffer made from one holds no other user's
// bytes (cache.h's rule).
//
// Thread-safe. The pool's lock is never held while it calls the PoolBudget.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <thread>

#include "cache/memory_backing.h"
#include "common/clock.h"
#include "common/mutex.h"
#include "common/status.h"

namespace tce {

// Where pooled bytes are counted (the Cache). Any thread.
class PoolBudget {
 public:
  virtual ~PoolBudget() = default;
  // Whether `bytes` more may be pooled within the budget; counted when true.
  virtual bool ReservePool(uint64_t bytes) = 0;
  // `bytes` left the pool (taken by a buffer, dropped, or never made).
  virtual void ReturnPool(uint64_t bytes) = 0;
  // Blocks while a save is in flight (its copy wants the memory bandwidth
  // that zero-filling takes), at most `max`; returns how long it waited.
  virtual std::chrono::milliseconds WaitForNoSaves(std::chrono::milliseconds max) = 0;
};

struct PoolStats {
  uint64_t target = 0;   // bytes the pool fills up to
  uint64_t held = 0;     // bytes pre-faulted and waiting now
  uint64_t pieces = 0;   // memfds waiting now
  uint64_t filled = 0;   // bytes pre-faulted since start
  uint64_t taken = 0;    // buffers made from the pool since start
  uint64_t missed = 0;   // new buffers the pool could not serve (it was empty)
  bool filling = false;  // the filler is working now
};

class BufferPool {
 public:
  // The largest piece the filler makes.
  static constexpr uint64_t kMaxPiece = uint64_t{1} << 30;
  // The filler pre-faults a piece this much at a time, yielding to saves
  // before each step, and yields at most kMaxYield per piece in all (so a
  // client that never commits delays the refill, never stops it).
  static constexpr uint64_t kStep = uint64_t{64} << 20;
  static constexpr std::chrono::milliseconds kMaxYield{5000};

  // Until the first Take shows what sizes are wanted, the filler makes
  // pieces of halving sizes: half the target (at most `max_piece`), then
  // half of that, down to max_piece / 16, so that a file of any size finds a
  // piece that is not much larger (the tail of a shrunk piece is freed and
  // made again). After a Take, it makes pieces of the size taken, trading
  // smaller pieces for them when the budget has no room left.
  BufferPool(uint64_t target, Backing backing, PoolBudget* budget, uint64_t max_piece = kMaxPiece,
             Clock* clock = Clock::Real());
  ~BufferPool();  // Stop()
  BufferPool(const BufferPool&) = delete;
  BufferPool& operator=(const BufferPool&) = delete;

  // Starts the filler thread (once).
  void Start();
  // Stops the filler and closes every piece (their bytes are returned).
  void Stop();

  // A pre-faulted, zero-filled, unsealed memfd of exactly `capacity` bytes,
  // made from the piece that fits best (the smallest one at least as large,
  // else the largest, grown). NOT_FOUND when the pool is empty (counted as a
  // miss); a failed resize is returned and the piece is dropped. The caller
  // owns *fd. The piece's bytes are returned to the PoolBudget before it is
  // resized, so the caller must have counted `capacity` itself.
  Status Take(uint64_t capacity, int* fd);
  // Drops pieces (smallest first) until at least `bytes` are freed or the
  // pool is empty; returns the bytes freed.
  uint64_t Shed(uint64_t bytes);
  // Blocks until the filler has looked and found nothing to do (the pool is
  // full, or the budget or the kernel refuses more) since the last Take, or
  // `timeout_ms` passes; true when idle. For tests and benchmarks.
  bool WaitIdle(int timeout_ms);

  PoolStats Stats();
  Backing backing() const { return backing_; }

 private:
  void Fill();
  // A fresh memfd of `size` bytes, pre-faulted kStep at a time after
  // yielding to saves in flight.
  Status MakePiece(uint64_t size, int* fd);
  // Drops pieces smaller than `size`, smallest first, until `need` bytes
  // are freed; with `all_or_none`, drops none (returns 0) when they hold
  // less than `need`.
  uint64_t ShedBelow(uint64_t size, uint64_t need, bool all_or_none = true);

  const uint64_t target_;
  const Backing backing_;
  PoolBudget* const budget_;
  Clock* const clock_;
  Mutex mu_;
  CondVar wake_;  // a piece was taken, or Stop
  CondVar idle_;  // the filler went idle
  std::multimap<uint64_t, int> pieces_ GUARDED_BY(mu_);  // size -> memfd
  uint64_t held_ GUARDED_BY(mu_) = 0;
  const uint64_t max_piece_;
  uint64_t next_piece_ GUARDED_BY(mu_) = 0;  // the size the filler makes next
  bool learned_ GUARDED_BY(mu_) = false;  // next_piece_ is a taken size
  uint64_t filled_ GUARDED_BY(mu_) = 0;
  uint64_t taken_ GUARDED_BY(mu_) = 0;
  uint64_t missed_ GUARDED_BY(mu_) = 0;
  bool filling_ GUARDED_BY(mu_) = false;  // not resting
  bool resting_ GUARDED_BY(mu_) = false;  // the filler found nothing it may do
  bool stop_ GUARDED_BY(mu_) = false;
  std::thread filler_;
};

}  // namespace tce
