#include "storage/s3_test_server.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <strings.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdlib>

#include "common/clock.h"

namespace tce {
namespace {

constexpr size_t kMaxHeaders = 64 << 10;
constexpr size_t kMaxBody = 64 << 20;
constexpr size_t kMaxConnections = 64;

std::string Lower(std::string s) {
  for (char& c : s) c = static_cast<char>(tolower(static_cast<unsigned char>(c)));
  return s;
}

std::string Trim(const std::string& s) {
  const size_t b = s.find_first_not_of(" \t");
  if (b == std::string::npos) return "";
  return s.substr(b, s.find_last_not_of(" \t") - b + 1);
}

bool SendAll(int fd, const std::string& data) {
  size_t sent = 0;
  while (sent < data.size()) {
    const ssize_t w = ::send(fd, data.data() + sent, data.size() - sent, MSG_NOSIGNAL);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return false;
    sent += static_cast<size_t>(w);
  }
  return true;
}

// Reads more of the connection into `buf`; false at its end.
bool ReadMore(int fd, std::string* buf) {
  char chunk[64 << 10];
  for (;;) {
    const ssize_t r = ::recv(fd, chunk, sizeof(chunk), 0);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return false;
    buf->append(chunk, static_cast<size_t>(r));
    return true;
  }
}

// Parses one request from the front of `buf` (reading more as needed).
bool ReadRequest(int fd, std::string* buf, SeenRequest* req) {
  size_t end;
  while ((end = buf->find("\r\n\r\n")) == std::string::npos) {
    if (buf->size() > kMaxHeaders || !ReadMore(fd, buf)) return false;
  }
  const std::string head = buf->substr(0, end);
  size_t line_end = head.find("\r\n");
  const std::string request_line = head.substr(0, line_end);
  const size_t sp1 = request_line.find(' '), sp2 = request_line.rfind(' ');
  if (sp1 == std::string::npos || sp2 == sp1) return false;
  req->method = request_line.substr(0, sp1);
  req->target = request_line.substr(sp1 + 1, sp2 - sp1 - 1);
  const size_t q = req->target.find('?');
  req->path = req->target.substr(0, q);
  req->query = q == std::string::npos ? "" : req->target.substr(q + 1);
  size_t length = 0;
  while (line_end != std::string::npos && line_end < head.size()) {
    const size_t next = head.find("\r\n", line_end + 2);
    const std::string line = head.substr(line_end + 2, next == std::string::npos ? std::string::npos
                                                                                  : next - line_end - 2);
    line_end = next;
    const size_t colon = line.find(':');
    if (colon == std::string::npos) continue;
    req->headers.emplace_back(Lower(Trim(line.substr(0, colon))), Trim(line.substr(colon + 1)));
    if (req->headers.back().first == "content-length") {
      length = std::strtoull(req->headers.back().second.c_str(), nullptr, 10);
    }
  }
  if (length > kMaxBody) return false;
  while (buf->size() < end + 4 + length) {
    if (!ReadMore(fd, buf)) return false;
  }
  req->body = buf->substr(end + 4, length);
  buf->erase(0, end + 4 + length);
  return true;
}

std::string Response(const SeenRequest& req, const Answer& a) {
  std::string out = "HTTP/1.1 " + std::to_string(a.status) + " Status\r\n";
  bool has_length = false;
  for (const auto& h : a.headers) {
    out += h.first + ": " + h.second + "\r\n";
    has_length |= strcasecmp(h.first.c_str(), "content-length") == 0;
  }
  if (!has_length) {
    out += "Content-Length: " +
           std::to_string(a.claim_length >= 0 ? static_cast<size_t>(a.claim_length) : a.body.size()) + "\r\n";
  }
  out += "\r\n";
  if (req.method != "HEAD") out += a.body;
  return out;
}

}  // namespace

std::string SeenRequest::Header(const std::string& name) const {
  for (const auto& h : headers) {
    if (h.first == name) return h.second;
  }
  return "";
}

bool SeenRequest::Has(const std::string& name) const {
  for (const auto& h : headers) {
    if (h.first == name) return true;
  }
  return false;
}

TestHttpServer::TestHttpServer(Handler handler, const std::string& address, int port)
    : handler_(std::move(handler)), address_(address) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return;
  const int one = 1;
  ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  socklen_t len = sizeof(addr);
  if (::inet_pton(AF_INET, address.c_str(), &addr.sin_addr) != 1 ||
      ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 || ::listen(fd, 64) != 0 ||
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    ::close(fd);
    return;
  }
  listen_fd_ = fd;
  port_ = ntohs(addr.sin_port);
  acceptor_ = std::thread(&TestHttpServer::AcceptLoop, this);
}

TestHttpServer::~TestHttpServer() { Stop(); }

void TestHttpServer::AcceptLoop() {
  for (;;) {
    const int fd = ::accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
    if (fd < 0 && errno == EINTR) continue;
    if (fd < 0) return;  // Stop shut the socket down
    MutexLock lock(&mu_);
    if (stopping_ || fds_.size() >= kMaxConnections) {
      ::close(fd);
      continue;
    }
    fds_.push_back(fd);
    threads_.emplace_back(&TestHttpServer::Serve, this, fd, ++connections_);
  }
}

void TestHttpServer::Serve(int fd, int connection) {
  std::string buf;
  for (;;) {
    SeenRequest req;
    if (stopping() || !ReadRequest(fd, &buf, &req)) break;
    req.connection = connection;
    const Answer a = Handle(req);
    if (a.hang) {
      WaitForStop();
      break;
    }
    if (a.drop || !SendAll(fd, Response(req, a)) || a.claim_length >= 0) break;
  }
  MutexLock lock(&mu_);
  for (size_t i = 0; i < fds_.size(); ++i) {
    if (fds_[i] == fd) fds_.erase(fds_.begin() + i);
  }
  ::close(fd);
}

Answer TestHttpServer::Handle(SeenRequest req) {
  Answer a;
  {
    MutexLock lock(&handler_mu_);
    a = handler_(req);
  }
  MutexLock lock(&mu_);
  requests_.push_back(std::move(req));
  cv_.SignalAll();
  return a;
}

void TestHttpServer::WaitForStop() {
  MutexLock lock(&mu_);
  while (!stopping_) cv_.Wait(&mu_);
}

bool TestHttpServer::stopping() {
  MutexLock lock(&mu_);
  return stopping_;
}

std::vector<SeenRequest> TestHttpServer::requests() {
  MutexLock lock(&mu_);
  return requests_;
}

size_t TestHttpServer::request_count() {
  MutexLock lock(&mu_);
  return requests_.size();
}

int TestHttpServer::connections() {
  MutexLock lock(&mu_);
  return connections_;
}

bool TestHttpServer::WaitForRequests(size_t n) {
  const Clock::TimePoint limit = Clock::Real()->Now() + std::chrono::seconds(60);  // against hangs only
  MutexLock lock(&mu_);
  while (requests_.size() < n) {
    if (!Clock::Real()->WaitUntil(&cv_, &mu_, limit)) return requests_.size() >= n;
  }
  return true;
}

void TestHttpServer::Stop() {
  std::vector<std::thread> threads;
  {
    MutexLock lock(&mu_);
    if (stopping_ || listen_fd_ < 0) return;
    stopping_ = true;
    for (int fd : fds_) ::shutdown(fd, SHUT_RDWR);
    cv_.SignalAll();
  }
  ::shutdown(listen_fd_, SHUT_RDWR);
  acceptor_.join();
  ::close(listen_fd_);
  {
    MutexLock lock(&mu_);
    threads.swap(threads_);
  }
  for (auto& t : threads) t.join();
}

}  // namespace tce
