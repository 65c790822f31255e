// CallLimiter: how many calls of one kind (those that wait on a peer, those
// that block until something happens) may run at once: at most `total` in the whole server, and at most `per_key` for any
// one key (a uid), so one user cannot take every slot from the others. A call
// beyond either bound is refused at once, never queued: a queued call would
// hold its RPC thread, which is what the bound is there to save.
//
// Thread-safe. A Slot gives its place back when it is destroyed, on whatever
// thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <string>

#include "common/mutex.h"
#include "common/status.h"

namespace tce {

class CallLimiter {
 public:
  // A place taken by Enter; empty until then. Movable, not copyable.
  class Slot {
   public:
    Slot() = default;
    ~Slot() { Leave(); }
    Slot(Slot&& o) noexcept : limiter_(o.limiter_), key_(o.key_) { o.limiter_ = nullptr; }
    Slot& operator=(Slot&& o) noexcept;
    Slot(const Slot&) = delete;
    Slot& operator=(const Slot&) = delete;
    bool held() const { return limiter_ != nullptr; }
    void Leave();  // gives the place back now (idempotent)

   private:
    friend class CallLimiter;
    CallLimiter* limiter_ = nullptr;
    uint64_t key_ = 0;
  };

  // `setting` and `per_key_setting` name what sets `total` and `per_key`
  // (a refusal names the bound it met), `what` the calls it counts. A
  // `per_key` of 0 or above `total` is `total`.
  CallLimiter(size_t total, size_t per_key, std::string setting, std::string per_key_setting,
              std::string what = "calls that wait on a peer");

  // Takes a place for `key` in *slot (which must be empty), or returns
  // RESOURCE_EXHAUSTED, saying which bound was reached and naming the
  // setting, and leaves *slot empty.
  Status Enter(uint64_t key, Slot* slot) EXCLUDES(mu_);

  size_t total() const { return total_; }
  size_t per_key() const { return per_key_; }
  size_t running() const EXCLUDES(mu_);  // places taken now

 private:
  void Leave(uint64_t key) EXCLUDES(mu_);

  const size_t total_;
  const size_t per_key_;
  const std::string setting_;
  const std::string per_key_setting_;
  const std::string what_;
  mutable Mutex mu_;
  size_t running_ GUARDED_BY(mu_) = 0;
  std::map<uint64_t, size_t> by_key_ GUARDED_BY(mu_);  // keys with a place only
};

}  // namespace tce
