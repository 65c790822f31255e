// tce-server's daemon: parses the settings, wires the cache, persister,
// metadata, ring and RPC servers together, serves until SIGTERM or SIGINT,
// then drains. Called once, from main(); the only code that decides the
// process's exit code.
#pragma once

#include <functional>
#include <memory>

#include "ring/transport.h"

namespace tce {

// What a main() may change about the daemon it runs. tce-server changes
// nothing; tce-server-faulty (a test build) injects faults here.
struct DaemonHooks {
  // Wraps the ring's transport once it is made (a Transport decorator).
  // Empty: the transport the settings name, as made.
  std::function<std::unique_ptr<Transport>(std::unique_ptr<Transport>)> wrap_transport;
};

// Runs the daemon on the command line `argv`; returns the exit code.
int RunDaemon(int argc, char** argv, const DaemonHooks& hooks = DaemonHooks());

}  // namespace tce
