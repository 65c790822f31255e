#include "common/net.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>

namespace tce {
namespace {

// An address as 16 bytes (IPv4 as IPv4-mapped IPv6), for comparing.
bool AddressBytes(const sockaddr* sa, unsigned char out[16]) {
  if (sa->sa_family == AF_INET6) {
    std::memcpy(out, &reinterpret_cast<const sockaddr_in6*>(sa)->sin6_addr, 16);
    return true;
  }
  if (sa->sa_family != AF_INET) return false;
  std::memset(out, 0, 10);
  out[10] = out[11] = 0xff;
  std::memcpy(out + 12, &reinterpret_cast<const sockaddr_in*>(sa)->sin_addr, 4);
  return true;
}

std::string AddressText(const unsigned char a[16]) {
  char text[INET6_ADDRSTRLEN] = "?";
  static const unsigned char kMapped[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
  if (std::memcmp(a, kMapped, 12) == 0)
    inet_ntop(AF_INET, a + 12, text, sizeof(text));
  else
    inet_ntop(AF_INET6, a, text, sizeof(text));
  return text;
}

}  // namespace

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

Status CheckPeerSource(int fd, const std::string& endpoint) {
  sockaddr_storage ss{};
  socklen_t len = sizeof(ss);
  unsigned char from[16];
  if (getpeername(fd, reinterpret_cast<sockaddr*>(&ss), &len) != 0 ||
      !AddressBytes(reinterpret_cast<sockaddr*>(&ss), from))
    return Status::PermissionDenied("the connection's source address is unknown");
  addrinfo* ai = nullptr;
  if (!ResolveEndpoint(endpoint, false, &ai).ok())
    return Status::PermissionDenied("it announced " + endpoint + ", whose host does not resolve here");
  bool same = false;
  for (addrinfo* a = ai; a && !same; a = a->ai_next) {
    unsigned char named[16];
    same = AddressBytes(a->ai_addr, named) && std::memcmp(named, from, 16) == 0;
  }
  freeaddrinfo(ai);
  if (same) return Status::OK();
  return Status::PermissionDenied("it connected from " + AddressText(from) + " but announced " + endpoint +
                                  ": a peer's connections come from the host it advertises");
}

void BindSource(int fd, int family, const std::string& self) {
  std::string host;
  int port = 0;
  if (!ParseEndpoint(self, &host, &port).ok()) return;
  addrinfo hints{};
  hints.ai_family = family;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICHOST;
  addrinfo* ai = nullptr;
  if (getaddrinfo(host.c_str(), "0", &hints, &ai) != 0) return;  // a name, or another family
  unsigned char any[16];
  static const unsigned char kAny4[16] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 0, 0, 0, 0};
  static const unsigned char kAny6[16] = {};
  if (AddressBytes(ai->ai_addr, any) && std::memcmp(any, kAny4, 16) != 0 && std::memcmp(any, kAny6, 16) != 0)
    (void)!bind(fd, ai->ai_addr, ai->ai_addrlen);  // not an address of this node: left to the kernel
  freeaddrinfo(ai);
}

}  // namespace tce
