#include "daemon/metrics_endpoint.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include <gtest/gtest.h>

namespace tce {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;

// Bounds every wait on the server in these tests: only a hang reaches it.
constexpr int kHangMs = 30000;

int Connect(const std::string& endpoint) {
  const int port = std::stoi(endpoint.substr(endpoint.rfind(':') + 1));
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  EXPECT_EQ(connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0) << strerror(errno);
  return fd;
}

// Everything the server sends until it closes; "<hang>" if it never does.
std::string ReadToEof(int fd) {
  std::string out;
  char buf[4096];
  while (true) {
    pollfd p{fd, POLLIN, 0};
    if (poll(&p, 1, kHangMs) <= 0) return out + "<hang>";
    const ssize_t n = recv(fd, buf, sizeof(buf), 0);
    if (n <= 0) return out;  // EOF, or reset
    out.append(buf, static_cast<size_t>(n));
  }
}

std::string Request(const std::string& endpoint, const std::string& request) {
  const int fd = Connect(endpoint);
  EXPECT_EQ(send(fd, request.data(), request.size(), MSG_NOSIGNAL), static_cast<ssize_t>(request.size()));
  std::string reply = ReadToEof(fd);
  close(fd);
  return reply;
}

std::string Scrape(const std::string& endpoint) { return Request(endpoint, "GET /metrics HTTP/1.1\r\n\r\n"); }

bool StartsWith(const std::string& s, const std::string& prefix) { return s.compare(0, prefix.size(), prefix) == 0; }

MetricsServerLimits Limits(milliseconds deadline, int workers, int waiting) {
  MetricsServerLimits limits;
  limits.deadline = deadline;
  limits.workers = workers;
  limits.waiting = waiting;
  return limits;
}

std::unique_ptr<MetricsServer> Serve(MetricsServerLimits limits) {
  auto server = std::make_unique<MetricsServer>("127.0.0.1:0", [] { return std::string("tce_up 1\n"); }, limits);
  EXPECT_TRUE(server->Start().ok());
  return server;
}

TEST(MetricsServer, AnswersScrapesAndBadRequests) {
  auto server = Serve({});
  const std::string ok = Scrape(server->endpoint());
  EXPECT_TRUE(StartsWith(ok, "HTTP/1.1 200 OK\r\n")) << ok;
  EXPECT_NE(ok.find("\r\n\r\ntce_up 1\n"), std::string::npos) << ok;
  EXPECT_TRUE(StartsWith(Request(server->endpoint(), "GET /x HTTP/1.1\r\n\r\n"), "HTTP/1.1 404 "));
  EXPECT_TRUE(StartsWith(Request(server->endpoint(), "junk\n\n"), "HTTP/1.1 400 "));
}

TEST(MetricsServer, ServesOthersWhileSilentClientsHoldWorkers) {
  // The silent clients would hold a worker each for a minute.
  auto server = Serve(Limits(seconds(60), 3, 1));
  std::vector<int> silent = {Connect(server->endpoint()), Connect(server->endpoint())};
  const std::string ok = Scrape(server->endpoint());
  EXPECT_TRUE(StartsWith(ok, "HTTP/1.1 200 OK\r\n")) << ok;
  for (int fd : silent) close(fd);
}

TEST(MetricsServer, ClosesARequestThatTricklesPastItsDeadline) {
  // A byte every 20 ms: no single read ever waits long, the request never ends.
  auto server = Serve(Limits(milliseconds(200), 1, 1));
  const int fd = Connect(server->endpoint());
  const auto give_up = std::chrono::steady_clock::now() + milliseconds(kHangMs);
  bool closed = false;
  while (!closed && std::chrono::steady_clock::now() < give_up) {
    pollfd p{fd, POLLIN, 0};
    char c;
    closed = send(fd, "X", 1, MSG_NOSIGNAL) != 1 ||  // reset by the server
             (poll(&p, 1, 20) == 1 && recv(fd, &c, 1, 0) <= 0);
  }
  EXPECT_TRUE(closed) << "the trickling client was never closed";
  close(fd);
  // And a silent one, too: closed unanswered.
  const int quiet = Connect(server->endpoint());
  EXPECT_EQ(ReadToEof(quiet), "");
  close(quiet);
}

TEST(MetricsServer, RefusesConnectionsPastTheWorkersAndTheWait) {
  auto server = Serve(Limits(seconds(60), 2, 1));
  std::vector<int> held;
  for (int i = 0; i < 3; ++i) held.push_back(Connect(server->endpoint()));
  // Accepted in order: the fourth finds two served and one waiting.
  const int extra = Connect(server->endpoint());
  const std::string refused = ReadToEof(extra);
  EXPECT_TRUE(StartsWith(refused, "HTTP/1.1 503 Service Unavailable\r\n")) << refused;
  close(extra);
  for (int fd : held) close(fd);
  // Once the server sees them gone, scrapes are served again.
  std::string reply;
  const auto give_up = std::chrono::steady_clock::now() + milliseconds(kHangMs);
  do {
    reply = Scrape(server->endpoint());
  } while (!StartsWith(reply, "HTTP/1.1 200 ") && std::chrono::steady_clock::now() < give_up);
  EXPECT_TRUE(StartsWith(reply, "HTTP/1.1 200 OK\r\n")) << reply;
}

TEST(MetricsServer, StopClosesServedAndWaitingConnectionsWithoutWaitingForThem) {
  auto server = Serve(Limits(seconds(600), 1, 1));
  const int served = Connect(server->endpoint());
  const int waiting = Connect(server->endpoint());
  // The connections are accepted before Stop (a scrape queued behind them
  // would wait the deadline): a third is refused once both are in hand.
  std::string refused;
  const auto give_up = std::chrono::steady_clock::now() + milliseconds(kHangMs);
  do {
    const int extra = Connect(server->endpoint());
    refused = ReadToEof(extra);
    close(extra);
  } while (!StartsWith(refused, "HTTP/1.1 503 ") && std::chrono::steady_clock::now() < give_up);
  const auto t0 = std::chrono::steady_clock::now();
  server->Stop();
  // Far below the deadline: Stop did not wait for the clients.
  EXPECT_LT(std::chrono::steady_clock::now() - t0, seconds(300));
  EXPECT_EQ(ReadToEof(served), "");
  EXPECT_EQ(ReadToEof(waiting), "");
  close(served);
  close(waiting);
}

}  // namespace
}  // namespace tce
