#include "common/metrics.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

namespace tce {

Histogram::Histogram(std::vector<double> upper_bounds)
    : bounds_(std::move(upper_bounds)), buckets_(new std::atomic<uint64_t>[bounds_.size() + 1]) {
  for (size_t i = 0; i <= bounds_.size(); ++i) buckets_[i].store(0);
}

void Histogram::Observe(double value) {
  const size_t i = static_cast<size_t>(std::lower_bound(bounds_.begin(), bounds_.end(), value) - bounds_.begin());
  buckets_[i].fetch_add(1, std::memory_order_relaxed);
  sum_micro_.fetch_add(static_cast<uint64_t>(std::max(0.0, value) * 1e6 + 0.5), std::memory_order_relaxed);
  count_.fetch_add(1, std::memory_order_relaxed);
}

Histogram::Snapshot Histogram::Take() const {
  Snapshot s;
  s.bounds = bounds_;
  uint64_t running = 0;
  for (size_t i = 0; i <= bounds_.size(); ++i) {
    running += buckets_[i].load(std::memory_order_relaxed);
    s.cumulative.push_back(running);
  }
  s.count = running;  // consistent with the buckets (count_ may be a step ahead)
  s.sum = static_cast<double>(sum_micro_.load(std::memory_order_relaxed)) / 1e6;
  return s;
}

TransferMetrics::TransferMetrics()
    : seconds({0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300}),
      megabytes_per_second({10, 50, 100, 250, 500, 1000, 2000, 4000, 8000, 16000}) {}

void TransferMetrics::Succeeded(uint64_t n, double secs) {
  bytes.fetch_add(n, std::memory_order_relaxed);
  seconds.Observe(secs);
  if (secs > 0) megabytes_per_second.Observe(static_cast<double>(n) / secs / 1e6);
}

namespace {

std::string Number(double v) {
  if (std::isinf(v)) return v > 0 ? "+Inf" : "-Inf";
  if (std::isnan(v)) return "NaN";
  char buf[32];
  if (v == std::floor(v) && std::fabs(v) < 1e15) {
    snprintf(buf, sizeof(buf), "%.0f", v);
  } else {
    snprintf(buf, sizeof(buf), "%.9g", v);
  }
  return buf;
}

std::string EscapeLabel(const std::string& v) {
  std::string out;
  for (char c : v) {
    if (c == '\\' || c == '"') out += '\\';
    if (c == '\n') {
      out += "\\n";
      continue;
    }
    out += c;
  }
  return out;
}

}  // namespace

void PromText::Header(const std::string& name, const std::string& help, const char* type) {
  if (std::find(declared_.begin(), declared_.end(), name) != declared_.end()) return;
  declared_.push_back(name);
  out_ += "# HELP " + name + " " + help + "\n# TYPE " + name + " " + type + "\n";
}

void PromText::Sample(const std::string& name, const Labels& labels, double value) {
  out_ += name;
  if (!labels.empty()) {
    out_ += '{';
    for (size_t i = 0; i < labels.size(); ++i) {
      if (i) out_ += ',';
      out_ += labels[i].first + "=\"" + EscapeLabel(labels[i].second) + '"';
    }
    out_ += '}';
  }
  out_ += ' ' + Number(value) + '\n';
}

void PromText::Gauge(const std::string& name, const std::string& help, double value, const Labels& labels) {
  Header(name, help, "gauge");
  Sample(name, labels, value);
}

void PromText::Counter(const std::string& name, const std::string& help, double value,
                       const Labels& labels) {
  Header(name, help, "counter");
  Sample(name, labels, value);
}

void PromText::AddHistogram(const std::string& name, const std::string& help, const Histogram& h) {
  Header(name, help, "histogram");
  Histogram::Snapshot s = h.Take();
  for (size_t i = 0; i < s.bounds.size(); ++i)
    Sample(name + "_bucket", {{"le", Number(s.bounds[i])}}, static_cast<double>(s.cumulative[i]));
  Sample(name + "_bucket", {{"le", "+Inf"}}, static_cast<double>(s.count));
  Sample(name + "_sum", {}, s.sum);
  Sample(name + "_count", {}, static_cast<double>(s.count));
}

}  // namespace tce
