#include "rpc/fd_server.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
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

FdServer::FdServer(SessionStore* sessions, VersionStore* versions, FdServerOptions options)
    : cache_(sessions), versions_(versions), opt_(std::move(options)),
      per_uid_(opt_.max_sessions_per_uid, "sessions", "max_sessions_per_uid") {}

FdServer::~FdServer() { Stop(); }

Status FdServer::Start() {
  Status s = ListenUnix(opt_.path, SOCK_SEQPACKET, opt_.socket_gid, &listen_fd_);
  if (!s.ok()) return s;
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
  for (auto& [fd, conn] : sessions_) {
    if (range_buffers_) range_buffers_->Drop(conn.session);
    cache_->CloseSession(conn.session);
    per_uid_.Give(conn.uid);
    ::close(fd);
  }
  sessions_.clear();
  for (int* fd : {&listen_fd_, &wake_[0], &wake_[1]}) {
    if (*fd >= 0) ::close(*fd);
    *fd = -1;
  }
}

int FdServer::PollTimeoutMs() const {
  int timeout = -1;
  if (!acceptor_.Accepting(&timeout)) timeout = std::max(timeout, 1);
  {  // the periodic check (idle sessions, expired version leases)
    auto ms = opt_.clock->Left(next_idle_check_).count();
    int idle = static_cast<int>(std::max<int64_t>(1, std::min<int64_t>(ms, 60000)));
    timeout = timeout < 0 ? idle : std::min(timeout, idle);
  }
  return timeout;
}

void FdServer::Loop() {
  while (true) {
    int ignored = 0;
    const bool accepting = acceptor_.Accepting(&ignored);
    std::vector<struct pollfd> fds;
    fds.push_back({wake_[0], POLLIN, 0});
    fds.push_back({accepting ? listen_fd_ : -1, POLLIN, 0});  // -1: not polled while backing off
    for (const auto& [fd, conn] : sessions_) fds.push_back({fd, POLLIN, 0});
    int n = poll(fds.data(), fds.size(), PollTimeoutMs());
    if (n < 0) {
      if (errno == EINTR) continue;
      TCE_LOG(kError, "fdsock") << "poll: " << std::strerror(errno);
      return;
    }
    if (fds[0].revents) return;
    if (fds[1].revents & POLLIN) AcceptSome();
    for (size_t i = 2; i < fds.size(); ++i) {
      if (!fds[i].revents) continue;
      if ((fds[i].revents & POLLIN) && Serve(fds[i].fd)) continue;
      Close(fds[i].fd);
    }
    if (opt_.clock->Now() >= next_idle_check_) CloseIdle();
  }
}

void FdServer::AcceptSome() {
  struct ucred cred;
  for (int i = 0; i < 64; ++i) {
    int fd = acceptor_.Accept(listen_fd_, SOCK_CLOEXEC, &cred);
    if (fd < 0) return;
    Admit(fd, cred);
  }
}

void FdServer::Admit(int fd, const struct ucred& cred) {
  Status refused;
  if (!opt_.allowed_uids.count(cred.uid)) {
    refused = Status::PermissionDenied("peer uid " + std::to_string(cred.uid) +
                                       " is not allowed to use this server (allowed_uids)");
  } else if (sessions_.size() >= opt_.max_sessions) {
    refused = Status::ResourceExhausted("too many sessions (max_sessions=" +
                                        std::to_string(opt_.max_sessions) + ")");
  } else {
    refused = per_uid_.Take(cred.uid);  // counted when OK
  }
  if (!refused.ok()) {
    uint64_t dropped = 0;
    if (refused_log_.Allow(&dropped))
      TCE_LOG(kWarning, "fdsock") << "refused pid=" << cred.pid << ": " << refused.message()
                                  << Suppressed(dropped);
    Status ignored = SendPacket(fd, Hello(refused, ""), -1);  // never blocks
    (void)ignored;
    ::close(fd);
    return;
  }
  std::string session = cache_->OpenSession(cred.uid, cred.pid, cred.gid);
  Status s = SendPacket(fd, Hello(Status::OK(), session), -1);
  if (!s.ok()) {
    cache_->CloseSession(session);
    per_uid_.Give(cred.uid);
    ::close(fd);
    return;
  }
  sessions_[fd] = Conn{session, cred.uid};
}

void FdServer::CloseIdle() {
  const auto period = opt_.idle_timeout.count() > 0
                          ? std::min<std::chrono::milliseconds>(
                                std::chrono::seconds(5), opt_.idle_timeout / 4 + std::chrono::milliseconds(1))
                          : std::chrono::milliseconds(std::chrono::seconds(5));
  next_idle_check_ = opt_.clock->Now() + period;
  versions_->ExpireVersionLeases();
  if (opt_.idle_timeout.count() <= 0) return;
  std::vector<std::string> idle = cache_->IdleSessions(opt_.idle_timeout);
  if (idle.empty()) return;
  std::set<std::string> wanted(idle.begin(), idle.end());
  std::vector<int> victims;
  for (const auto& [fd, conn] : sessions_)
    if (wanted.count(conn.session)) victims.push_back(fd);
  for (int fd : victims) {
    TCE_LOG(kInfo, "fdsock") << "closing session " << sessions_[fd].session.substr(0, 8) << ": idle for "
                             << opt_.idle_timeout.count() / 1000 << " s (session_idle_timeout_s)";
    Close(fd);
  }
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
    TCE_LOG(kWarning, "fdsock") << "dropping session " << sessions_[fd].session.substr(0, 8)
                                << ": malformed FdRequest";
    return false;
  }
  const Conn& conn = sessions_[fd];
  int memfd = -1;
  bool writable = false;
  uint64_t capacity = 0;
  if (!req.range_buffer())
    s = cache_->FdFor(conn.session, req.buffer_id(), &memfd, &writable, &capacity, req.keep_mapped());
  else if (!range_buffers_)
    s = Status::NotSupported("this server has no range buffers");
  else if (bool admin = false; (s = cache_->CheckCaller(conn.session, &admin, /*uid=*/nullptr)).ok())  // a live session
    s = range_buffers_->Fd(conn.session, conn.uid, &memfd, &capacity);
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
    if (range_buffers_) range_buffers_->Drop(it->second.session);
    cache_->CloseSession(it->second.session);
    per_uid_.Give(it->second.uid);
    sessions_.erase(it);
  }
  ::close(fd);
}

}  // namespace tce
