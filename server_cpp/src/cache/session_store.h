// SessionStore: the Cache's sessions as the fd socket (rpc/fd_server.h) and
// the RPC layer (rpc/service.h) see them: one session per client connection
// on the fd socket, opened after its SO_PEERCRED check, and every client
// call acts with its session's uid (the security contract:
// cache/client_store.h); the fds of the buffers a session writes or reads.
//
// Served by the Cache's Sessions component (cache/sessions.h), which asks
// the Cache for what a session holds there (its allocations, leases and
// mapped buffers). Thread-safe.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "common/status.h"

namespace tce {

class SessionStore {
 public:
  virtual ~SessionStore() = default;

  // Sessions: one per client connection on the fd socket.
  // `gid` -1: unknown (persistence then keeps the server's group).
  virtual std::string OpenSession(uid_t uid, pid_t pid, gid_t gid) = 0;
  // Aborts the session's PENDING allocations, drops its leases and mappings.
  virtual void CloseSession(const std::string& session) = 0;
  // Sessions with no request for `idle`, no lease and no PENDING allocation
  // (the fd socket closes them).
  virtual std::vector<std::string> IdleSessions(std::chrono::milliseconds idle) = 0;
  // UNAUTHENTICATED for an unknown session; else whether its uid is an
  // administrator (sees everything), and its uid (`uid` may be null).
  virtual Status CheckCaller(const std::string& session, bool* admin, uid_t* uid) = 0;
  // The session's uid and primary gid (-1: unknown); UNAUTHENTICATED for an
  // unknown session.
  virtual Status CallerIds(const std::string& session, uid_t* uid, gid_t* gid) = 0;

  // A new fd for a buffer: writable when it is PENDING for this session,
  // read-only when this session leases it. The caller owns the fd. With
  // `keep_mapped` (a leased buffer), the session is told to unmap the
  // buffer when it goes (FdRequest.keep_mapped).
  virtual Status FdFor(const std::string& session, uint64_t buffer_id, int* fd, bool* writable,
                       uint64_t* capacity, bool keep_mapped) = 0;
};

}  // namespace tce
