// Test helpers shared by the gtests. Not linked into the server.
#pragma once

#include <stdlib.h>

#include <stdexcept>
#include <string>

namespace tce {

// A fresh directory /tmp/<prefix>-<random>; the caller removes it.
inline std::string MakeTempDir(const std::string& prefix) {
  std::string tmpl = "/tmp/" + prefix + "-" + std::string(6, 'X');
  if (!mkdtemp(tmpl.data())) throw std::runtime_error("mkdtemp failed for " + tmpl);
  return tmpl;
}

}  // namespace tce
