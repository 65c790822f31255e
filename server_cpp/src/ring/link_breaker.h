// LinkBreaker: ends the server's waits on peers when it stops. Each peer link
// connected with a breaker is registered while it lives; BreakAll shuts down
// every registered socket, so a connect, send or receive blocked on a peer
// that never answers fails at once instead of at peer_timeout_ms, and a link
// that connects afterwards is refused at once. The sockets stay open (their
// owners close them): a number is never shut down after it was reused.
//
// Thread-safe: any thread registers; the daemon's main thread breaks.
#pragma once

#include <cstddef>
#include <set>

#include "common/mutex.h"

namespace tce {

class LinkBreaker {
 public:
  // Registers `fd` (a socket being connected or in use); false, registering
  // nothing, once BreakAll ran.
  bool Add(int fd) EXCLUDES(mu_);
  // Unregisters `fd`; call before closing it.
  void Remove(int fd) EXCLUDES(mu_);
  // Shuts down every registered socket; returns how many (each was waiting
  // on a peer or kept for the next call).
  size_t BreakAll() EXCLUDES(mu_);
  bool broken() const EXCLUDES(mu_);

 private:
  mutable Mutex mu_;
  std::set<int> fds_ GUARDED_BY(mu_);
  bool broken_ GUARDED_BY(mu_) = false;
};

}  // namespace tce
