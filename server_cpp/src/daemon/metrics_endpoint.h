// The Prometheus endpoint: a minimal HTTP/1.1 server answering GET /metrics
// with the text exposition format, one request per connection, one thread.
// A client gets at most `io_timeout` to send its request, so a stuck scraper
// delays the next one by that much and never stops the server; anything but
// a well-formed GET or HEAD of /metrics gets 400, 404 or 405.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <chrono>
#include <functional>
#include <string>
#include <thread>

#include "cache/cache.h"
#include "common/metrics.h"
#include "common/status.h"
#include "tce/v1/tce.pb.h"

namespace tce {

class MetricsServer {
 public:
  MetricsServer(std::string listen, std::function<std::string()> render,
                std::chrono::milliseconds io_timeout = std::chrono::seconds(2));
  ~MetricsServer();
  MetricsServer(const MetricsServer&) = delete;
  MetricsServer& operator=(const MetricsServer&) = delete;

  Status Start();  // binds (port 0: any free one) and starts serving
  void Stop();
  const std::string& endpoint() const { return endpoint_; }  // host:port bound

 private:
  void Loop();
  void Serve(int fd);

  const std::string listen_;
  const std::function<std::string()> render_;
  const std::chrono::milliseconds io_timeout_;
  std::string endpoint_;
  int listen_fd_ = -1;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

// The exposition: what `tce status` reports (gauges and counters), files per
// state, and the transfer histograms of persistence and backups.
std::string RenderMetrics(const v1::StatusResponse& status, const CacheStats& stats,
                          const TransferMetrics& persist, const TransferMetrics& backup);

}  // namespace tce
