#include "rpc/fd_server.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <vector>

#include "common/logging.h"
#include "rpc/fd_passing.h"
#include "tce/v1/tce.pb.h"

namespace tce {
namespace {
constexpr size_t kMaxPacket = 4096;

std::string Hello(const Status& s, const std::string& session) {
  v1::SessionHello hello;
  hello.set_code(static_cast<int>(s.code()));
  hello.set_message(s.message());
  hello.set_session(session);
  hello.set_server_version(TCE_VERSION);
  hello.set_server_pid(getpid());
  return hello.SerializeAsString();
}
}  // namespace

FdServer::FdServer(Cache* cache, std::string path, std::set<uid_t> allowed_uids,
                   size_t max_sessions)
    : cache_(cache), path_(std::move(path)), allowed_uids_(std::move(allowed_uids)),
      max_sessions_(max_sessions) {}

FdServer::~FdServer() { Stop(); }

Status FdServer::Start() {
  struct sockaddr_un addr;
  std::memset(&addr, 0, sizeof(addr));
  addr.sun_family = AF_UNIX;
  if (path_.size() >= sizeof(addr.sun_path))
    return Status::InvalidArgument("socket path too long (max " +
                                   std::to_string(sizeof(addr.sun_path) - 1) + "): " + path_);
  std::memcpy(addr.sun_path, path_.c_str(), path_.size());
  listen_fd_ = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
  if (listen_fd_ < 0) return Status::FromErrno(errno, "socket");
  if (bind(listen_fd_, reinterpret_cast<struct sockaddr*>(&addr), sizeof(addr)) != 0)
    return Status::FromErrno(errno, "bind " + path_);
  chmod(path_.c_str(), 0666);
  if (listen(listen_fd_, 128) != 0) return Status::FromErrno(errno, "listen " + path_);
  if (pipe2(wake_, O_CLOEXEC | O_NONBLOCK) != 0) return Status::FromErrno(errno, "pipe");
  thread_ = std::thread([this] { Loop(); });
  return Status::OK();
}

void FdServer::Stop() {
  if (thread_.joinable()) {
    char c = 1;
    ssize_t ignored = write(wake_[1], &c, 1);
    (void)ignored;
    thread_.join();
  }
  for (auto& [fd, session] : sessions_) {
    cache_->CloseSession(session);
    ::close(fd);
  }
  sessions_.clear();
  for (int* fd : {&listen_fd_, &wake_[0], &wake_[1]}) {
    if (*fd >= 0) ::close(*fd);
    *fd = -1;
  }
}

void FdServer::Loop() {
  while (true) {
    std::vector<struct pollfd> fds;
    fds.push_back({wake_[0], POLLIN, 0});
    fds.push_back({listen_fd_, POLLIN, 0});
    for (const auto& [fd, session] : sessions_) fds.push_back({fd, POLLIN, 0});
    int n = poll(fds.data(), fds.size(), -1);
    if (n < 0) {
      if (errno == EINTR) continue;
      TCE_LOG(kError, "fdsock") << "poll: " << std::strerror(errno);
      return;
    }
    if (fds[0].revents) return;
    if (fds[1].revents & POLLIN) Accept();
    for (size_t i = 2; i < fds.size(); ++i) {
      if (!fds[i].revents) continue;
      if ((fds[i].revents & POLLIN) && Serve(fds[i].fd)) continue;
      Close(fds[i].fd);
    }
  }
}

void FdServer::Accept() {
  int fd = accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
  if (fd < 0) {
    TCE_LOG(kWarning, "fdsock") << "accept: " << std::strerror(errno);
    return;
  }
  struct ucred cred;
  socklen_t len = sizeof(cred);
  if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0) {
    ::close(fd);
    return;
  }
  Status refused;
  if (!allowed_uids_.count(cred.uid)) {
    refused = Status::PermissionDenied("peer uid " + std::to_string(cred.uid) +
                                       " is not allowed to use this server (allowed_uids)");
  } else if (sessions_.size() >= max_sessions_) {
    refused = Status::ResourceExhausted("too many sessions (max_sessions=" +
                                        std::to_string(max_sessions_) + ")");
  }
  if (!refused.ok()) {
    TCE_LOG(kWarning, "fdsock") << "refused pid=" << cred.pid << ": " << refused.message();
    Status ignored = SendPacket(fd, Hello(refused, ""), -1);
    (void)ignored;
    ::close(fd);
    return;
  }
  std::string session = cache_->OpenSession(cred.uid, cred.pid, cred.gid);
  Status s = SendPacket(fd, Hello(Status::OK(), session), -1);
  if (!s.ok()) {
    cache_->CloseSession(session);
    ::close(fd);
    return;
  }
  sessions_[fd] = session;
}

bool FdServer::Serve(int fd) {
  std::string data;
  int stray = -1;
  Status s = RecvPacket(fd, kMaxPacket, &data, &stray);
  if (stray >= 0) ::close(stray);  // clients send no fds
  if (!s.ok() || data.empty()) {
    if (!s.ok()) {
      TCE_LOG(kWarning, "fdsock") << "dropping session: " << s.message();
    }
    return false;
  }
  v1::FdRequest req;
  if (!req.ParseFromString(data)) {
    TCE_LOG(kWarning, "fdsock") << "dropping session " << sessions_[fd].substr(0, 8)
                                << ": malformed FdRequest";
    return false;
  }
  int memfd = -1;
  bool writable = false;
  uint64_t capacity = 0;
  s = cache_->FdFor(sessions_[fd], req.buffer_id(), &memfd, &writable, &capacity);
  v1::FdReply reply;
  reply.set_code(static_cast<int>(s.code()));
  reply.set_message(s.message());
  reply.set_buffer_id(req.buffer_id());
  reply.set_capacity(capacity);
  reply.set_writable(writable);
  if (!s.ok()) {
    TCE_LOG(kWarning, "fdsock") << "refused fd for buffer " << req.buffer_id() << ": "
                                << s.ToString();
  } else {
    TCE_LOG(kDebug, "fdsock") << "passed buffer=" << req.buffer_id()
                              << (writable ? " writable" : " read-only");
  }
  Status sent = SendPacket(fd, reply.SerializeAsString(), memfd);
  if (memfd >= 0) ::close(memfd);
  return sent.ok();
}

void FdServer::Close(int fd) {
  auto it = sessions_.find(fd);
  if (it != sessions_.end()) {
    cache_->CloseSession(it->second);
    sessions_.erase(it);
  }
  ::close(fd);
}

}  // namespace tce
