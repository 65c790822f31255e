#include "rpc/acceptor.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "common/logging.h"

namespace tce {

Status ListenUnix(const std::string& path, int type, gid_t gid, int* out) {
  struct sockaddr_un addr;
  std::memset(&addr, 0, sizeof(addr));
  addr.sun_family = AF_UNIX;
  if (path.size() >= sizeof(addr.sun_path))
    return Status::InvalidArgument("socket path too long (max " +
                                   std::to_string(sizeof(addr.sun_path) - 1) + "): " + path);
  std::memcpy(addr.sun_path, path.c_str(), path.size());
  int fd = socket(AF_UNIX, type | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (fd < 0) return Status::FromErrno(errno, "socket");
  Status s;
  if (bind(fd, reinterpret_cast<struct sockaddr*>(&addr), sizeof(addr)) != 0)
    s = Status::FromErrno(errno, "bind " + path);
  else if (gid != static_cast<gid_t>(-1) && chown(path.c_str(), -1, gid) != 0)
    s = Status::FromErrno(errno, "chown " + path);
  else if (chmod(path.c_str(), 0660) != 0)
    s = Status::FromErrno(errno, "chmod " + path);
  else if (listen(fd, 128) != 0)
    s = Status::FromErrno(errno, "listen " + path);
  if (!s.ok()) {
    close(fd);
    return s;
  }
  *out = fd;
  return Status::OK();
}

Acceptor::Acceptor(const char* component, Clock* clock)
    : component_(component), clock_(clock), reserve_fd_(open("/dev/null", O_RDONLY | O_CLOEXEC)) {}

Acceptor::~Acceptor() {
  if (reserve_fd_ >= 0) close(reserve_fd_);
}

bool Acceptor::Accepting(int* wait_ms) const {
  const auto now = clock_->Now();
  if (now >= paused_until_) return true;
  *wait_ms = static_cast<int>(
      std::chrono::duration_cast<std::chrono::milliseconds>(paused_until_ - now).count() + 1);
  return false;
}

int Acceptor::Accept(int listen_fd, int flags, struct ucred* peer) {
  int wait_ms = 0;
  while (Accepting(&wait_ms)) {
    int fd = accept4(listen_fd, nullptr, nullptr, flags);
    if (fd < 0) {
      const int err = errno;
      if (err == EINTR || err == ECONNABORTED) continue;
      if (err == EMFILE || err == ENFILE || err == ENOBUFS || err == ENOMEM) Shed(listen_fd, err);
      return -1;  // EAGAIN: nothing more waiting
    }
    backoff_ = std::chrono::milliseconds(0);
    socklen_t len = sizeof(*peer);
    if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, peer, &len) == 0) return fd;
    close(fd);
  }
  return -1;
}

void Acceptor::Shed(int listen_fd, int err) {
  if (reserve_fd_ >= 0) {
    close(reserve_fd_);
    int fd = accept4(listen_fd, nullptr, nullptr, SOCK_CLOEXEC);
    if (fd >= 0) close(fd);
    reserve_fd_ = open("/dev/null", O_RDONLY | O_CLOEXEC);
  }
  backoff_ = std::min<std::chrono::milliseconds>(
      std::chrono::seconds(1), std::max<std::chrono::milliseconds>(backoff_ * 2, std::chrono::milliseconds(10)));
  paused_until_ = clock_->Now() + backoff_;
  uint64_t dropped = 0;
  if (log_.Allow(&dropped))
    TCE_LOG(kWarning, component_) << "accept: " << std::strerror(err)
                                  << ": closed a waiting connection, pausing accepts for "
                                  << backoff_.count() << " ms" << Suppressed(dropped);
}

}  // namespace tce
