// FdServer: the fd socket (<socket>.fd, SOCK_SEQPACKET). Each connection is a
// client session: on accept it checks the peer's uid (SO_PEERCRED), opens a
// Cache session and sends SessionHello; it then answers FdRequests with
// FdReply + the buffer's memfd (SCM_RIGHTS). When a connection closes, or
// sends anything malformed, its session ends. One thread runs the loop;
// Start/Stop may be called from any one other thread.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <map>
#include <set>
#include <string>
#include <thread>

#include "cache/cache.h"

namespace tce {

class FdServer {
 public:
  FdServer(Cache* cache, std::string path, std::set<uid_t> allowed_uids, size_t max_sessions);
  ~FdServer();

  // Binds and listens (the caller removed any stale socket), starts the thread.
  Status Start();
  void Stop();

 private:
  void Loop();
  void Accept();
  // Returns false when the connection must be closed.
  bool Serve(int fd);
  void Close(int fd);

  Cache* const cache_;
  const std::string path_;
  const std::set<uid_t> allowed_uids_;
  const size_t max_sessions_;
  int listen_fd_ = -1;
  int wake_[2] = {-1, -1};
  std::thread thread_;
  std::map<int, std::string> sessions_;  // connection fd -> session id; loop thread only
};

}  // namespace tce
