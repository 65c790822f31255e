// FdServer: the fd socket (<socket>.fd, SOCK_SEQPACKET). Each connection is a
// client session: on accept it checks the peer's uid (SO_PEERCRED), opens a
// Cache session and sends SessionHello; it then answers FdRequests with
// FdReply + the buffer's memfd (SCM_RIGHTS). When a connection closes, or
// sends anything malformed, its session ends. One thread runs the loop;
// Start/Stop may be called from any one other thread.
//
// Security and limits: the socket file is 0660 (group `socket_gid`); a peer
// uid outside `allowed_uids`, a connection beyond `max_sessions`, or one of a
// uid that holds `max_sessions_per_uid` already (root included: the cap is
// what keeps one user from taking every session) gets a refusing
// SessionHello and is closed at once (such log lines are rate-limited). Out
// of fds, accept sheds and backs off (rpc/acceptor.h).
// Sessions idle for `idle_timeout` (SessionStore::IdleSessions) are closed.
// The same periodic check (every 5 s at most) ends version leases whose time
// ran out (VersionStore::ExpireVersionLeases).
#pragma once

#include <sys/types.h>

#include <chrono>
#include <map>
#include <set>
#include <string>
#include <thread>

#include "cache/session_store.h"
#include "cache/version_store.h"
#include "common/clock.h"
#include "common/log_limiter.h"
#include "rpc/acceptor.h"
#include "rpc/range_buffers.h"
#include "rpc/uid_counts.h"

namespace tce {

struct FdServerOptions {
  std::string path;
  std::set<uid_t> allowed_uids;
  size_t max_sessions = 1024;
  size_t max_sessions_per_uid = 256;
  std::chrono::milliseconds idle_timeout{0};  // 0: sessions never time out
  gid_t socket_gid = static_cast<gid_t>(-1);  // -1: the server's own group
  Clock* clock = Clock::Real();  // idle times and accept pauses are measured on it
};

class FdServer {
 public:
  FdServer(SessionStore* sessions, VersionStore* versions, FdServerOptions options);
  ~FdServer();

  // The sessions' range buffers (set before Start; without it an FdRequest
  // for one is refused): handed out on request, dropped with the session.
  void SetRangeBuffers(RangeBuffers* buffers) { range_buffers_ = buffers; }
  // Binds and listens (the caller removed any stale socket), starts the thread.
  Status Start();
  void Stop();

 private:
  void Loop();
  // Accepts what is waiting (a bounded batch per wake).
  void AcceptSome();
  void Admit(int fd, const struct ucred& cred);
  // Returns false when the connection must be closed.
  bool Serve(int fd);
  void Close(int fd);
  void CloseIdle();
  // How long poll may sleep: until the accept pause ends or the next idle check.
  int PollTimeoutMs() const;

  SessionStore* const cache_;  // the sessions
  VersionStore* const versions_;  // ends the version leases whose time ran out
  const FdServerOptions opt_;
  RangeBuffers* range_buffers_ = nullptr;
  int listen_fd_ = -1;
  int wake_[2] = {-1, -1};
  std::thread thread_;
  struct Conn {
    std::string session;
    uid_t uid = static_cast<uid_t>(-1);
  };
  // Loop thread only:
  std::map<int, Conn> sessions_;  // by connection fd
  UidCounts per_uid_;             // sessions_ by uid
  Acceptor acceptor_{"fdsock", opt_.clock};
  Clock::TimePoint next_idle_check_{};
  LogLimiter refused_log_{5, std::chrono::seconds(10)};
};

}  // namespace tce
