#include "rpc/control_listener.h"

#include <fcntl.h>
#include <grpcpp/server.h>
#include <grpcpp/server_posix.h>
#include <poll.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "common/logging.h"

namespace tce {

ControlListener::ControlListener(grpc::Server* server, std::string path,
                                 std::set<uid_t> allowed_uids, gid_t gid, size_t max_connections,
                                 size_t max_connections_per_uid)
    : server_(server), path_(std::move(path)), allowed_uids_(std::move(allowed_uids)), gid_(gid),
      max_connections_(max_connections),
      per_uid_(max_connections_per_uid, "control connections", "max_control_connections_per_uid") {}

size_t ControlListener::Prune() {
  for (auto it = live_.begin(); it != live_.end();) {
    struct stat st;
    const bool same = fstat(it->first, &st) == 0 && S_ISSOCK(st.st_mode) && st.st_ino == it->second.ino;
    if (same) {
      ++it;
    } else {
      per_uid_.Give(it->second.uid);
      it = live_.erase(it);
    }
  }
  return live_.size();
}

ControlListener::~ControlListener() { Stop(); }

Status ControlListener::Start() {
  Status s = ListenUnix(path_, SOCK_STREAM, gid_, &listen_fd_);
  if (!s.ok()) return s;
  if (pipe2(wake_, O_CLOEXEC | O_NONBLOCK) != 0) return Status::FromErrno(errno, "pipe");
  thread_ = std::thread([this] { Loop(); });
  return Status::OK();
}

void ControlListener::Stop() {
  if (thread_.joinable()) {
    char c = 1;
    ssize_t ignored = write(wake_[1], &c, 1);
    (void)ignored;
    thread_.join();
  }
  for (int* fd : {&listen_fd_, &wake_[0], &wake_[1]}) {
    if (*fd >= 0) close(*fd);
    *fd = -1;
  }
}

void ControlListener::Loop() {
  while (true) {
    int wait_ms = -1;
    const bool accepting = acceptor_.Accepting(&wait_ms);
    struct pollfd fds[2] = {{wake_[0], POLLIN, 0}, {accepting ? listen_fd_ : -1, POLLIN, 0}};
    if (poll(fds, 2, accepting ? -1 : wait_ms) < 0 && errno != EINTR) {
      TCE_LOG(kError, "control") << "poll: " << std::strerror(errno);
      return;
    }
    if (fds[0].revents) return;
    if (!(fds[1].revents & POLLIN)) continue;
    struct ucred cred;
    for (int i = 0; i < 64; ++i) {
      int fd = acceptor_.Accept(listen_fd_, SOCK_CLOEXEC | SOCK_NONBLOCK, &cred);
      if (fd < 0) break;
      if (Admit(fd, cred)) {
        grpc::AddInsecureChannelFromFd(server_, fd);  // gRPC owns it now
      } else {
        close(fd);
      }
    }
  }
}

bool ControlListener::Admit(int fd, const struct ucred& cred) {
  std::string refused;
  struct stat st;
  if (!allowed_uids_.count(cred.uid)) {
    refused = "peer uid " + std::to_string(cred.uid) + " is not allowed to use this server (allowed_uids)";
  } else if (Prune() >= max_connections_) {
    refused = std::to_string(live_.size()) + " control connections open (max_control_connections)";
  } else if (fstat(fd, &st) != 0) {
    refused = "fstat: " + std::string(std::strerror(errno));
  } else if (Status s = per_uid_.Take(cred.uid); !s.ok()) {
    refused = s.message();
  } else {
    live_[fd] = Conn{st.st_ino, cred.uid};
    return true;
  }
  uint64_t dropped = 0;
  if (refused_log_.Allow(&dropped))
    TCE_LOG(kWarning, "control") << "refused pid=" << cred.pid << " uid=" << cred.uid << ": " << refused
                                 << Suppressed(dropped);
  return false;
}

}  // namespace tce
