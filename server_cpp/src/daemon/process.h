// The daemon's dealings with the process and the OS around it (daemon.cc
// wires the subsystems; these are what it needs of the machine): exit
// messages, directories and sockets it claims, the fd limit, the shutdown
// drain, the environment, and the actions that are not a run. Called from
// RunDaemon's thread only.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <csignal>
#include <cstdint>
#include <map>
#include <string>

#include "cache/cache.h"
#include "common/clock.h"
#include "common/logging.h"
#include "common/status.h"
#include "daemon/options.h"
#include "persist/persister.h"

namespace tce {

// The persister's settings (its metrics are the daemon's to point at).
PersistOptions PersistSettings(const Options& opt);
// Prints "tce-server: msg" on stderr; returns `code` (the exit code).
int Fail(const std::string& msg, int code);
// Creates `dir` and its missing parents (0755); `dir` itself gets `mode`.
Status MkdirP(const std::string& dir, mode_t mode = 0755, bool* created = nullptr);
// "" -> -1 (keep the server's own group); a group name or a numeric gid.
Status ResolveGroup(const std::string& name, gid_t* out);
// Raises the open-file limit to the hard limit, and has a root server drop
// its supplementary groups (see process.cc).
void PrepareProcess();
// Removes a stale socket file; refuses if a live server answers on it.
Status ClaimSocket(const std::string& path, int type);
// Graceful shutdown: refuse new saves, then wait until what is cached is
// persisted (and backed up), `limit` passes, or one of `signals` arrives.
void Drain(Cache* cache, const sigset_t* signals, std::chrono::milliseconds limit);
// Every environment variable, for the TCE_* overrides of the settings.
std::map<std::string, std::string> Environment();
// Does `action` (anything but running the daemon); returns the exit code.
int RunAction(Action action, const Options& opt);

// Logs, once the daemon's objects are gone, how long their teardown after
// "stopped" took: mostly the cache's memory going back to the kernel (tens
// of ms per GiB of 4 KiB pages: seconds for a large budget), which the pod's
// grace period must cover too.
class ExitLog {
 public:
  ~ExitLog() {
    if (!armed_) return;
    const auto took = std::chrono::duration_cast<std::chrono::milliseconds>(Clock::Real()->Now() - since_);
    TCE_LOG(kInfo, "daemon") << "exited teardown_ms=" << took.count() << " memory_bytes=" << bytes_;
  }
  // From now; `bytes`: the cache memory the teardown gives back.
  void Arm(uint64_t bytes) {
    armed_ = true;
    bytes_ = bytes;
    since_ = Clock::Real()->Now();
  }

 private:
  bool armed_ = false;
  uint64_t bytes_ = 0;
  Clock::TimePoint since_;
};

}  // namespace tce
