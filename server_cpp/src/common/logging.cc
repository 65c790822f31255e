#include "common/logging.h"

#include <unistd.h>

#include <atomic>
#include <cctype>
#include <cstdio>
#include <ctime>
#include <utility>
#include <vector>

#include "common/clock.h"

namespace tce {
namespace {
std::atomic<int> g_level{static_cast<int>(LogLevel::kInfo)};
std::atomic<int> g_format{static_cast<int>(LogFormat::kText)};
}  // namespace

void SetLogLevel(LogLevel level) { g_level.store(static_cast<int>(level)); }
LogLevel GetLogLevel() { return static_cast<LogLevel>(g_level.load()); }

const char* LogLevelName(LogLevel level) {
  switch (level) {
    case LogLevel::kDebug: return "debug";
    case LogLevel::kInfo: return "info";
    case LogLevel::kWarning: return "warning";
    case LogLevel::kError: return "error";
  }
  return "info";
}

bool ParseLogLevel(const std::string& text, LogLevel* out) {
  for (LogLevel l : {LogLevel::kDebug, LogLevel::kInfo, LogLevel::kWarning, LogLevel::kError}) {
    if (text == LogLevelName(l)) {
      *out = l;
      return true;
    }
  }
  return false;
}

void SetLogFormat(LogFormat format) { g_format.store(static_cast<int>(format)); }

bool ParseLogFormat(const std::string& text, LogFormat* out) {
  if (text == "text") *out = LogFormat::kText;
  else if (text == "json") *out = LogFormat::kJson;
  else return false;
  return true;
}

namespace {

void AppendJsonString(std::string* out, const std::string& s) {
  *out += '"';
  for (unsigned char c : s) {
    switch (c) {
      case '"': *out += "\\\""; break;
      case '\\': *out += "\\\\"; break;
      case '\n': *out += "\\n"; break;
      case '\t': *out += "\\t"; break;
      default:
        if (c < 0x20) {
          char u[8];
          snprintf(u, sizeof(u), "\\u%04x", c);
          *out += u;
        } else {
          *out += static_cast<char>(c);
        }
    }
  }
  *out += '"';
}

// The `key=value` words of a message: a key is letters and `_`, the value runs to the
// next space (the first occurrence of a key wins; reserved names are skipped).
std::vector<std::pair<std::string, std::string>> Fields(const std::string& message) {
  std::vector<std::pair<std::string, std::string>> out;
  size_t i = 0;
  while (i < message.size()) {
    size_t end = message.find(' ', i);
    if (end == std::string::npos) end = message.size();
    const std::string word = message.substr(i, end - i);
    size_t eq = word.find('=');
    bool key = eq != std::string::npos && eq > 0;
    for (size_t k = 0; key && k < eq; ++k) key = std::isalpha(static_cast<unsigned char>(word[k])) || word[k] == '_';
    if (key) {
      std::string name = word.substr(0, eq);
      bool seen = name == "ts" || name == "level" || name == "component" || name == "msg";
      for (const auto& f : out) seen |= f.first == name;
      if (!seen) out.emplace_back(std::move(name), word.substr(eq + 1));
    }
    i = end + 1;
  }
  return out;
}

}  // namespace

std::string FormatLogLine(LogFormat format, const std::string& when, LogLevel level,
                          const char* component, const std::string& message) {
  static const char* const kUpper[] = {"DEBUG", "INFO", "WARNING", "ERROR"};
  if (format == LogFormat::kText)
    return when + ' ' + kUpper[static_cast<int>(level)] + ' ' + component + ": " + message;
  std::string out = "{\"ts\":";
  AppendJsonString(&out, when);
  out += ",\"level\":";
  AppendJsonString(&out, LogLevelName(level));
  out += ",\"component\":";
  AppendJsonString(&out, component);
  out += ",\"msg\":";
  AppendJsonString(&out, message);
  for (const auto& [k, v] : Fields(message)) {
    out += ',';
    AppendJsonString(&out, k);
    out += ':';
    AppendJsonString(&out, v);
  }
  return out + '}';
}

namespace internal {

LogLine::~LogLine() {
  const int64_t now_ms = Clock::Real()->UnixNowNs() / 1000000;
  const time_t secs = static_cast<time_t>(now_ms / 1000);
  struct tm tm;
  gmtime_r(&secs, &tm);
  char when[40];
  size_t n = strftime(when, sizeof(when), "%Y-%m-%dT%H:%M:%S", &tm);
  snprintf(when + n, sizeof(when) - n, ".%03dZ", static_cast<int>(now_ms % 1000));
  const std::string line =
      FormatLogLine(static_cast<LogFormat>(g_format.load()), when, level_, component_, stream_.str()) + '\n';
  ssize_t ignored = ::write(STDERR_FILENO, line.data(), line.size());
  (void)ignored;
}

}  // namespace internal
}  // namespace tce
