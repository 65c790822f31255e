// Metrics: the server's counters and histograms, and the Prometheus text
// exposition format (version 0.0.4) they are scraped in. Histograms are
// lock-free (atomic buckets); any thread may observe while another renders.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace tce {

class Histogram {
 public:
  explicit Histogram(std::vector<double> upper_bounds);  // ascending; +Inf is implied
  void Observe(double value);

  struct Snapshot {
    std::vector<double> bounds;
    std::vector<uint64_t> cumulative;  // per bound, then +Inf (== count)
    double sum = 0;
    uint64_t count = 0;
  };
  Snapshot Take() const;

 private:
  const std::vector<double> bounds_;
  std::unique_ptr<std::atomic<uint64_t>[]> buckets_;  // bounds_.size() + 1 (the +Inf one)
  std::atomic<uint64_t> count_{0};
  std::atomic<uint64_t> sum_micro_{0};  // the sum, in millionths (atomic without a CAS loop)
};

// One kind of background transfer (persistence, backup): latency and
// throughput of each that succeeded, and the attempts that failed.
struct TransferMetrics {
  TransferMetrics();
  void Succeeded(uint64_t bytes, double seconds);
  void Failed() { failures.fetch_add(1, std::memory_order_relaxed); }

  Histogram seconds;
  Histogram megabytes_per_second;
  std::atomic<uint64_t> bytes{0};
  std::atomic<uint64_t> failures{0};
};

// Builds an exposition: each family once, with HELP and TYPE.
class PromText {
 public:
  // `labels`: already formatted pairs, e.g. {"state", "cached"}.
  using Labels = std::vector<std::pair<std::string, std::string>>;
  void Gauge(const std::string& name, const std::string& help, double value, const Labels& labels = {});
  void Counter(const std::string& name, const std::string& help, double value,
               const Labels& labels = {});
  void AddHistogram(const std::string& name, const std::string& help, const Histogram& h);
  const std::string& text() const { return out_; }

 private:
  void Header(const std::string& name, const std::string& help, const char* type);
  void Sample(const std::string& name, const Labels& labels, double value);

  std::string out_;
  std::vector<std::string> declared_;
};

}  // namespace tce
