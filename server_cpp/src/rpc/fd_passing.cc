#include "rpc/fd_passing.h"

#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <vector>

namespace tce {

Status SendPacket(int sock, const std::string& data, int fd) {
  struct iovec iov;
  iov.iov_base = const_cast<char*>(data.data());
  iov.iov_len = data.size();
  struct msghdr msg;
  std::memset(&msg, 0, sizeof(msg));
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  alignas(struct cmsghdr) char control[CMSG_SPACE(sizeof(int))];
  if (fd >= 0) {
    std::memset(control, 0, sizeof(control));
    msg.msg_control = control;
    msg.msg_controllen = sizeof(control);
    struct cmsghdr* c = CMSG_FIRSTHDR(&msg);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int));
    std::memcpy(CMSG_DATA(c), &fd, sizeof(int));
  }
  ssize_t n;
  do {
    n = sendmsg(sock, &msg, MSG_NOSIGNAL | MSG_DONTWAIT);
  } while (n < 0 && errno == EINTR);
  if (n < 0) return Status::FromErrno(errno, "sendmsg");
  if (static_cast<size_t>(n) != data.size()) return Status::Internal("short send");
  return Status::OK();
}

Status RecvPacket(int sock, size_t max, std::string* data, int* fd) {
  *fd = -1;
  std::vector<char> buf(max + 1);
  struct iovec iov;
  iov.iov_base = buf.data();
  iov.iov_len = buf.size();
  alignas(struct cmsghdr) char control[CMSG_SPACE(sizeof(int) * 4)];
  struct msghdr msg;
  std::memset(&msg, 0, sizeof(msg));
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  msg.msg_control = control;
  msg.msg_controllen = sizeof(control);
  ssize_t n;
  do {
    n = recvmsg(sock, &msg, MSG_CMSG_CLOEXEC);
  } while (n < 0 && errno == EINTR);
  if (n < 0) return Status::FromErrno(errno, "recvmsg");
  // Close every fd that came along except the first one we hand back.
  for (struct cmsghdr* c = CMSG_FIRSTHDR(&msg); c; c = CMSG_NXTHDR(&msg, c)) {
    if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
    size_t count = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
    for (size_t i = 0; i < count; ++i) {
      int got;
      std::memcpy(&got, CMSG_DATA(c) + i * sizeof(int), sizeof(int));
      if (*fd < 0) *fd = got;
      else ::close(got);
    }
  }
  if ((msg.msg_flags & (MSG_TRUNC | MSG_CTRUNC)) || static_cast<size_t>(n) > max) {
    if (*fd >= 0) ::close(*fd);
    *fd = -1;
    return Status::InvalidArgument("packet larger than " + std::to_string(max) + " bytes");
  }
  data->assign(buf.data(), static_cast<size_t>(n));
  return Status::OK();
}

}  // namespace tce
