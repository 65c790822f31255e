// ControlListener: the control socket (gRPC over a Unix stream socket). It
// accepts connections itself and hands each to the gRPC server
// (AddInsecureChannelFromFd) because gRPC's own listener stops accepting for
// good after one EMFILE. Connections from uids outside `allowed_uids` are
// closed at once (they could open no session anyway), so they hold no fds;
// at most `max_connections` are open at once, and at most
// `max_connections_per_uid` of one uid (root included), so that one user
// cannot hold every connection (gRPC owns them, so a handed-over connection
// counts until its fd no longer refers to its socket: each accept checks
// with fstat); beyond either the new connection is closed at once; out of
// fds, accept sheds and backs off
// (rpc/acceptor.h). The socket is 0660, group `gid`. One thread runs the
// loop; Start/Stop from one other.
#pragma once

#include <sys/types.h>

#include <map>
#include <set>
#include <string>
#include <thread>

#include "common/log_limiter.h"
#include "common/status.h"
#include "rpc/acceptor.h"
#include "rpc/uid_counts.h"

namespace grpc {
class Server;
}

namespace tce {

class ControlListener {
 public:
  ControlListener(grpc::Server* server, std::string path, std::set<uid_t> allowed_uids,
                  gid_t gid, size_t max_connections = 1024,
                  size_t max_connections_per_uid = 256);
  ~ControlListener();

  Status Start();
  // Stops accepting; connections already handed to gRPC stay with it.
  void Stop();

 private:
  void Loop();
  // Forgets the connections gRPC has closed; returns how many are open.
  size_t Prune();
  // Whether the connection `fd` of `cred` may be handed to gRPC (counted if so).
  bool Admit(int fd, const struct ucred& cred);

  grpc::Server* const server_;
  const std::string path_;
  const std::set<uid_t> allowed_uids_;
  const gid_t gid_;
  const size_t max_connections_;
  struct Conn {
    ino_t ino;  // its socket's
    uid_t uid;
  };
  std::map<int, Conn> live_;  // loop thread only: by fd
  UidCounts per_uid_;         // loop thread only: live_ by uid
  int listen_fd_ = -1;
  int wake_[2] = {-1, -1};
  std::thread thread_;
  Acceptor acceptor_{"control"};                          // loop thread only
  LogLimiter refused_log_{5, std::chrono::seconds(10)};  // loop thread only
};

}  // namespace tce
