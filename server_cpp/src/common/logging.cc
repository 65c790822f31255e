#include "common/logging.h"

#include <sys/time.h>
#include <unistd.h>

#include <atomic>
#include <ctime>

namespace tce {
namespace {
std::atomic<int> g_level{static_cast<int>(LogLevel::kInfo)};
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

namespace internal {

LogLine::LogLine(LogLevel level, const char* component) {
  struct timeval tv;
  gettimeofday(&tv, nullptr);
  struct tm tm;
  gmtime_r(&tv.tv_sec, &tm);
  char when[32];
  strftime(when, sizeof(when), "%Y-%m-%dT%H:%M:%S", &tm);
  static const char* const kUpper[] = {"DEBUG", "INFO", "WARNING", "ERROR"};
  char ms[8];
  snprintf(ms, sizeof(ms), ".%03dZ", static_cast<int>(tv.tv_usec / 1000));
  stream_ << when << ms << ' ' << kUpper[static_cast<int>(level)] << ' ' << component << ": ";
}

LogLine::~LogLine() {
  stream_ << '\n';
  const std::string line = stream_.str();
  ssize_t ignored = ::write(STDERR_FILENO, line.data(), line.size());
  (void)ignored;
}

}  // namespace internal
}  // namespace tce
