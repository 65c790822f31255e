// Test helpers shared by the gtests. Not linked into the server.
#pragma once

#include <stdlib.h>

#include <chrono>
#include <functional>
#include <stdexcept>
#include <string>
#include <thread>

namespace tce {

// A fresh directory /tmp/<prefix>-<random>; the caller removes it.
inline std::string MakeTempDir(const std::string& prefix) {
  std::string tmpl = "/tmp/" + prefix + "-" + std::string(6, 'X');
  if (!mkdtemp(tmpl.data())) throw std::runtime_error("mkdtemp failed for " + tmpl);
  return tmpl;
}

// Waits for `done` to hold: true as soon as it does, false once `limit`
// passed without (a limit that only bounds a hang, never a timing rule).
inline bool Eventually(const std::function<bool()>& done,
                       std::chrono::milliseconds limit = std::chrono::seconds(20)) {
  const auto deadline = std::chrono::steady_clock::now() + limit;
  while (!done()) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));  // between looks, not a wait for time
  }
  return true;
}

}  // namespace tce
