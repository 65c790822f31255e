// Acceptor: accept(2) on a listening Unix socket that never spins. When the
// process is out of fds, the connection waiting in the backlog would make
// poll(2) report the socket again at once, forever; instead the Acceptor
// takes it with a reserve fd, closes it (its client learns at once), and
// pauses accepting (10 ms, doubling to 1 s, reset by the next success). Its
// log lines are rate-limited. Used by one thread (the owner's poll loop).
#pragma once

#include <sys/socket.h>
#include <sys/types.h>

#include <chrono>
#include <string>

#include "common/clock.h"
#include "common/log_limiter.h"
#include "common/status.h"

namespace tce {

// A listening, non-blocking Unix socket of `type` at `path` (the caller
// removed any stale one), mode 0660 and group `gid` (-1: the process's own)
// before it listens, so nobody else ever connects.
Status ListenUnix(const std::string& path, int type, gid_t gid, int* out);

class Acceptor {
 public:
  // Pauses are measured on `clock`.
  explicit Acceptor(const char* component, Clock* clock = Clock::Real());
  ~Acceptor();
  Acceptor(const Acceptor&) = delete;
  Acceptor& operator=(const Acceptor&) = delete;

  // A new connection (flags: SOCK_CLOEXEC and the like) with its peer's
  // credentials, or -1 when nothing more is waiting or accepting is paused.
  int Accept(int listen_fd, int flags, struct ucred* peer);
  // Whether `listen_fd` should be polled now; if not, `*wait_ms` says when.
  bool Accepting(int* wait_ms) const;

 private:
  void Shed(int listen_fd, int err);

  const char* const component_;
  Clock* const clock_;
  int reserve_fd_ = -1;  // /dev/null, given up to accept-and-close when out of fds
  Clock::TimePoint paused_until_{};
  std::chrono::milliseconds backoff_{0};
  LogLimiter log_{1, std::chrono::seconds(10), clock_};
};

}  // namespace tce
