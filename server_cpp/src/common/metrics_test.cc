#include "common/metrics.h"

#include <gtest/gtest.h>

#include "common/logging.h"

namespace tce {

TEST(Histogram, BucketsAreCumulativeAndTheSumIsKept) {
  Histogram h({1, 5, 10});
  for (double v : {0.5, 1.0, 3.0, 7.0, 50.0}) h.Observe(v);
  Histogram::Snapshot s = h.Take();
  EXPECT_EQ(s.cumulative, (std::vector<uint64_t>{2, 3, 4, 5}));  // le=1 includes 1.0
  EXPECT_EQ(s.count, 5u);
  EXPECT_DOUBLE_EQ(s.sum, 61.5);
}

TEST(PromText, WritesEachFamilyOnceWithItsType) {
  PromText m;
  m.Gauge("tce_files", "files by state", 2, {{"state", "cached"}});
  m.Gauge("tce_files", "files by state", 0, {{"state", "persisted"}});
  m.Counter("tce_failures_total", "failures", 3, {{"reason", "a \"quoted\" \\ one"}});
  Histogram h({0.5});
  h.Observe(0.25);
  m.AddHistogram("tce_persist_seconds", "latency", h);
  EXPECT_EQ(m.text(),
            "# HELP tce_files files by state\n# TYPE tce_files gauge\n"
            "tce_files{state=\"cached\"} 2\ntce_files{state=\"persisted\"} 0\n"
            "# HELP tce_failures_total failures\n# TYPE tce_failures_total counter\n"
            "tce_failures_total{reason=\"a \\\"quoted\\\" \\\\ one\"} 3\n"
            "# HELP tce_persist_seconds latency\n# TYPE tce_persist_seconds histogram\n"
            "tce_persist_seconds_bucket{le=\"0.5\"} 1\ntce_persist_seconds_bucket{le=\"+Inf\"} 1\n"
            "tce_persist_seconds_sum 0.25\ntce_persist_seconds_count 1\n");
}

TEST(TransferMetrics, ObservesLatencyThroughputAndBytes) {
  TransferMetrics t;
  t.Succeeded(200000000, 2.0);  // 100 MB/s
  t.Failed();
  EXPECT_EQ(t.bytes.load(), 200000000u);
  EXPECT_EQ(t.failures.load(), 1u);
  EXPECT_EQ(t.seconds.Take().count, 1u);
  EXPECT_DOUBLE_EQ(t.megabytes_per_second.Take().sum, 100.0);
}

TEST(LogFormat, TextKeepsTheClassicLine) {
  EXPECT_EQ(FormatLogLine(LogFormat::kText, "2026-11-23T10:00:00.000Z", LogLevel::kWarning, "cache",
                          "evicted job=j path=/x"),
            "2026-11-23T10:00:00.000Z WARNING cache: evicted job=j path=/x");
}

TEST(LogFormat, JsonHasOneFieldPerKeyAndEscapes) {
  EXPECT_EQ(FormatLogLine(LogFormat::kJson, "T", LogLevel::kInfo, "persist",
                          "persisted job=j path=/a\"b size=12 MBps=3.5 msg=no level=no trailing"),
            "{\"ts\":\"T\",\"level\":\"info\",\"component\":\"persist\","
            "\"msg\":\"persisted job=j path=/a\\\"b size=12 MBps=3.5 msg=no level=no trailing\","
            "\"job\":\"j\",\"path\":\"/a\\\"b\",\"size\":\"12\",\"MBps\":\"3.5\"}");
  EXPECT_EQ(FormatLogLine(LogFormat::kJson, "T", LogLevel::kError, "x", "tab\there\x01"),
            "{\"ts\":\"T\",\"level\":\"error\",\"component\":\"x\",\"msg\":\"tab\\there\\u0001\"}");
}

TEST(LogFormat, Parses) {
  LogFormat f;
  EXPECT_TRUE(ParseLogFormat("json", &f));
  EXPECT_EQ(f, LogFormat::kJson);
  EXPECT_TRUE(ParseLogFormat("text", &f));
  EXPECT_EQ(f, LogFormat::kText);
  EXPECT_FALSE(ParseLogFormat("xml", &f));
}

}  // namespace tce
