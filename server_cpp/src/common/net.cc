#include "common/net.h"

#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>

namespace tce {

Status ParseEndpoint(const std::string& endpoint, std::string* host, int* port) {
  size_t colon = endpoint.rfind(':');
  if (colon == std::string::npos || colon + 1 == endpoint.size())
    return Status::InvalidArgument("peer endpoint must be host:port, got '" + endpoint + "'");
  *host = endpoint.substr(0, colon);
  if (host->size() >= 2 && (*host)[0] == '[' && host->back() == ']') *host = host->substr(1, host->size() - 2);
  char* end = nullptr;
  long p = std::strtol(endpoint.c_str() + colon + 1, &end, 10);
  if (*end != '\0' || p < 0 || p > 65535)
    return Status::InvalidArgument("bad port in peer endpoint '" + endpoint + "'");
  *port = static_cast<int>(p);
  return Status::OK();
}

Status ResolveEndpoint(const std::string& endpoint, bool passive, addrinfo** out) {
  std::string host;
  int port = 0;
  Status s = ParseEndpoint(endpoint, &host, &port);
  if (!s.ok()) return s;
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  if (passive) hints.ai_flags = AI_PASSIVE;
  int rc = getaddrinfo(host.empty() ? nullptr : host.c_str(), std::to_string(port).c_str(), &hints, out);
  if (rc != 0) return Status::InvalidArgument("cannot resolve " + endpoint + ": " + gai_strerror(rc));
  return Status::OK();
}

Status ListenTcp(const std::string& endpoint, int* fd, std::string* bound) {
  addrinfo* ai = nullptr;
  Status s = ResolveEndpoint(endpoint, true, &ai);
  if (!s.ok()) return s;
  int sock = socket(ai->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
  int one = 1;
  if (sock >= 0) setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  if (sock < 0 || bind(sock, ai->ai_addr, ai->ai_addrlen) != 0 || listen(sock, 64) != 0) {
    int err = errno;
    freeaddrinfo(ai);
    if (sock >= 0) ::close(sock);
    return Status::FromErrno(err, "listen on " + endpoint);
  }
  freeaddrinfo(ai);
  sockaddr_storage ss{};
  socklen_t len = sizeof(ss);
  getsockname(sock, reinterpret_cast<sockaddr*>(&ss), &len);
  int real = ss.ss_family == AF_INET ? ntohs(reinterpret_cast<sockaddr_in*>(&ss)->sin_port)
                                     : ntohs(reinterpret_cast<sockaddr_in6*>(&ss)->sin6_port);
  *bound = WithPort(endpoint, real);
  *fd = sock;
  return Status::OK();
}

std::string WithPort(const std::string& endpoint, int port) {
  return endpoint.substr(0, endpoint.rfind(':')) + ":" + std::to_string(port);
}

void SetIoTimeouts(int fd, std::chrono::milliseconds timeout) {
  timeval tv{};
  tv.tv_sec = timeout.count() / 1000;
  tv.tv_usec = (timeout.count() % 1000) * 1000;
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
}

}  // namespace tce
