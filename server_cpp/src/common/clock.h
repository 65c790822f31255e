// Wall-clock time as the metadata and the file records keep it.
#pragma once

#include <chrono>
#include <cstdint>

namespace tce {

// Nanoseconds since the Unix epoch, now.
inline int64_t UnixNowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

}  // namespace tce
