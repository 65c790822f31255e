// A leveled logger: one line per event on stderr,
//   2026-11-22T10:00:00.123Z INFO cache: allocated job=j path=/x size=123
// Thread-safe (each line is written with a single write(2)).
#pragma once

#include <sstream>
#include <string>

namespace tce {

enum class LogLevel { kDebug = 0, kInfo = 1, kWarning = 2, kError = 3 };

void SetLogLevel(LogLevel level);
LogLevel GetLogLevel();
bool ParseLogLevel(const std::string& text, LogLevel* out);
const char* LogLevelName(LogLevel level);

namespace internal {
class LogLine {
 public:
  LogLine(LogLevel level, const char* component);
  ~LogLine();
  template <typename T>
  LogLine& operator<<(const T& v) {
    stream_ << v;
    return *this;
  }

 private:
  std::ostringstream stream_;
};
}  // namespace internal

}  // namespace tce

#define TCE_LOG(level, component)                               \
  if (::tce::LogLevel::level < ::tce::GetLogLevel()) {          \
  } else                                                        \
    ::tce::internal::LogLine(::tce::LogLevel::level, component)
