// A leveled logger: one line per event on stderr,
//   2026-11-22T10:00:00.123Z INFO cache: allocated job=j path=/x size=123
// or, in the json format, one object per line whose `key=value` words are
// also fields of their own:
//   {"ts":"2026-11-22T10:00:00.123Z","level":"info","component":"cache",
//    "msg":"allocated job=j path=/x size=123","job":"j","path":"/x","size":"123"}
// Thread-safe (each line is written with a single write(2)).
#pragma once

#include <sstream>
#include <string>

namespace tce {

enum class LogLevel { kDebug = 0, kInfo = 1, kWarning = 2, kError = 3 };
enum class LogFormat { kText = 0, kJson = 1 };

void SetLogLevel(LogLevel level);
LogLevel GetLogLevel();
bool ParseLogLevel(const std::string& text, LogLevel* out);
const char* LogLevelName(LogLevel level);
void SetLogFormat(LogFormat format);
bool ParseLogFormat(const std::string& text, LogFormat* out);
// The line `format` writes for one event (without the newline).
std::string FormatLogLine(LogFormat format, const std::string& when, LogLevel level,
                          const char* component, const std::string& message);

namespace internal {
class LogLine {
 public:
  LogLine(LogLevel level, const char* component) : level_(level), component_(component) {}
  ~LogLine();
  template <typename T>
  LogLine& operator<<(const T& v) {
    stream_ << v;
    return *this;
  }

 private:
  const LogLevel level_;
  const char* const component_;
  std::ostringstream stream_;
};
// Gives the streaming expression below a void type: `&` binds after `<<`.
struct Voidify {
  void operator&(const LogLine&) {}
};
}  // namespace internal

}  // namespace tce

// A conditional expression, not an `if`: safe as the body of an unbraced if.
#define TCE_LOG(level, component)                                      \
  (::tce::LogLevel::level < ::tce::GetLogLevel())                      \
      ? (void)0                                                        \
      : ::tce::internal::Voidify() & ::tce::internal::LogLine(::tce::LogLevel::level, component)
