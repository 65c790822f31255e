// Test helpers for the ring's gtests. Not linked into the server.
#pragma once

#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <string>

#include "ring/peer_server.h"

namespace tce {

// A PeerServer's options for a test: any loopback port, the cluster token
// `token`, a 2 s I/O timeout.
inline PeerServerOptions LoopbackPeerOptions(const std::string& token = "t") {
  PeerServerOptions po;
  po.listen = "127.0.0.1:0";
  po.key = token;
  po.io_timeout = std::chrono::milliseconds(2000);
  return po;
}

// A memfd of `size` patterned bytes.
inline int PatternFd(uint64_t size) {
  int fd = memfd_create("t", MFD_CLOEXEC);
  std::string bytes(size, '\0');
  for (uint64_t i = 0; i < size; ++i) bytes[i] = static_cast<char>(i * 31 + i / 4093);
  EXPECT_EQ(write(fd, bytes.data(), size), static_cast<ssize_t>(size));
  return fd;
}

}  // namespace tce
