// The Prometheus endpoint: a minimal HTTP/1.1 server answering GET /metrics
// with the text exposition format, one request per connection. A few workers
// serve connections at once, and each connection gets one deadline for its
// whole request (read the request, write the reply), however slowly its bytes
// come; a connection past the workers and the bounded wait is refused at once
// with 503. So slow or stuck clients delay nobody else, no client makes the
// server hold more than a fixed number of threads and fds, and Stop returns
// promptly. Anything but a well-formed GET or HEAD of /metrics gets 400, 404
// or 405. Untrusted input: any peer that reaches the address may connect.
// Start and Stop from one thread; the render callback runs on the workers.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <deque>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "cache/cache.h"
#include "common/log_limiter.h"
#include "common/metrics.h"
#include "common/mutex.h"
#include "common/status.h"
#include "tce/v1/tce.pb.h"

namespace tce {

struct MetricsServerLimits {
  // From the moment a worker takes a connection until its reply is written.
  std::chrono::milliseconds deadline = std::chrono::seconds(2);
  int workers = 4;  // connections served at once (fewer if threads run out)
  int waiting = 8;  // accepted connections waiting for a worker; more get 503
};

class MetricsServer {
 public:
  MetricsServer(std::string listen, std::function<std::string()> render,
                MetricsServerLimits limits = MetricsServerLimits());
  ~MetricsServer();
  MetricsServer(const MetricsServer&) = delete;
  MetricsServer& operator=(const MetricsServer&) = delete;

  Status Start();  // binds (port 0: any free one) and starts serving
  void Stop();     // closes every connection, waiting or served; returns promptly
  const std::string& endpoint() const { return endpoint_; }  // host:port bound

 private:
  void AcceptLoop();
  void Admit(int fd);  // hands `fd` to a worker, or refuses it when all are taken
  void WorkerLoop();
  void Serve(int fd);  // one request, within the deadline; closes `fd`

  const std::string listen_;
  const std::function<std::string()> render_;
  const MetricsServerLimits limits_;
  std::string endpoint_;
  int listen_fd_ = -1;
  int wake_fd_ = -1;  // an eventfd, readable once Stop begins: ends every wait
  std::thread acceptor_;
  std::vector<std::thread> workers_;
  LogLimiter refused_log_{1, std::chrono::seconds(10)};
  LogLimiter accept_log_{1, std::chrono::seconds(10)};

  Mutex mu_;
  CondVar work_;  // a connection is waiting, or Stop began
  std::deque<int> waiting_ GUARDED_BY(mu_);
  int capacity_ GUARDED_BY(mu_) = 0;  // workers running plus waiting slots
  int in_hand_ GUARDED_BY(mu_) = 0;   // connections waiting or being served
  bool stopping_ GUARDED_BY(mu_) = false;
};

// The exposition: what `tce status` reports (gauges and counters), files per
// state, and the transfer histograms of persistence and backups.
std::string RenderMetrics(const v1::StatusResponse& status, const CacheStats& stats,
                          const TransferMetrics& persist, const TransferMetrics& backup);

}  // namespace tce
