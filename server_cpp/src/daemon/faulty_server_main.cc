// tce-server-faulty: tce-server with faults to inject, for tests only. Built
// with TCE_BUILD_TESTS, never installed; tce-server has none of this. One
// flag of its own, anywhere among tce-server's, which pass on unchanged:
//   --ring-fault corrupt   the ring's transport flips one byte in the middle
//                          of every transfer this server sends (the receiver
//                          must refuse the copy: ring/corrupting_transport.h)
#include <iostream>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "common/logging.h"
#include "daemon/daemon.h"
#include "ring/corrupting_transport.h"

int main(int argc, char** argv) {
  const std::string flag = "--ring-fault";
  std::vector<char*> args = {argv[0]};
  std::string fault;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == flag && i + 1 < argc) {
      fault = argv[++i];
    } else if (arg.rfind(flag + "=", 0) == 0) {
      fault = arg.substr(flag.size() + 1);
    } else {
      args.push_back(argv[i]);
    }
  }
  tce::DaemonHooks hooks;
  if (fault == "corrupt") {
    hooks.wrap_transport = [](std::unique_ptr<tce::Transport> inner) {
      TCE_LOG(kWarning, "ring") << "ring_fault=corrupt: every transfer this server sends is corrupted (tests only)";
      return tce::NewCorruptingTransport(std::move(inner));
    };
  } else if (!fault.empty()) {
    std::cerr << "tce-server-faulty: " << flag << " '" << fault << "': the only fault is corrupt" << std::endl;
    return 2;
  }
  args.push_back(nullptr);
  return tce::RunDaemon(static_cast<int>(args.size()) - 1, args.data(), hooks);
}
