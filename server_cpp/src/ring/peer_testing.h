// Test helpers for the ring's gtests. Not linked into the server.
#pragma once

#include <chrono>
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

}  // namespace tce
