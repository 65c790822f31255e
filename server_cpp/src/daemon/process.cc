// The daemon's dealings with the process and the OS around it: exit
// messages, directories and sockets it claims, the fd limit, the shutdown
// drain, the environment, and the actions that are not a run.
#include "daemon/process.h"

#include <grp.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <vector>

#include "common/logging.h"
#include "daemon/settings.h"
#include "ring/transport_factory.h"

extern char** environ;

namespace tce {

PersistOptions PersistSettings(const Options& opt) {
  PersistOptions popt;
  popt.threads = opt.persist_threads;
  popt.retries = opt.persist_retries;
  popt.backoff = std::chrono::milliseconds(opt.persist_backoff_ms);
  popt.failed_retry = std::chrono::milliseconds(opt.persist_failed_retry_ms);
  return popt;
}


int Fail(const std::string& msg, int code) {
  std::cerr << "tce-server: " << msg << std::endl;
  return code;
}

// Creates `dir` and its missing parents (0755); `dir` itself gets `mode`.
// Returns whether it was created (an existing directory is left as it is).
Status MkdirP(const std::string& dir, mode_t mode, bool* created) {
  if (created) *created = false;
  if (dir.empty()) return Status::OK();
  struct stat st;
  if (stat(dir.c_str(), &st) == 0) return Status::OK();
  size_t slash = dir.rfind('/');
  if (slash != std::string::npos && slash > 0) {
    Status s = MkdirP(dir.substr(0, slash));
    if (!s.ok()) return s;
  }
  if (mkdir(dir.c_str(), mode) != 0) {
    if (errno == EEXIST) return Status::OK();
    return Status::FromErrno(errno, "mkdir " + dir);
  }
  if (chmod(dir.c_str(), mode) != 0) return Status::FromErrno(errno, "chmod " + dir);  // no umask
  if (created) *created = true;
  return Status::OK();
}

// "" -> -1 (keep the server's own group); a group name or a numeric gid.
Status ResolveGroup(const std::string& name, gid_t* out) {
  *out = static_cast<gid_t>(-1);
  if (name.empty()) return Status::OK();
  char* end = nullptr;
  unsigned long v = std::strtoul(name.c_str(), &end, 10);
  if (*end == '\0' && v < 0xFFFFFFFFul) {
    *out = static_cast<gid_t>(v);
    return Status::OK();
  }
  struct group grp, *found = nullptr;
  std::vector<char> buf(16384);
  if (getgrnam_r(name.c_str(), &grp, buf.data(), buf.size(), &found) != 0 || !found)
    return Status::InvalidArgument("unknown group '" + name + "'");
  *out = found->gr_gid;
  return Status::OK();
}

// Every connection and memfd costs an fd: use all the kernel allows us.
static void RaiseFdLimit() {
  struct rlimit rl;
  if (getrlimit(RLIMIT_NOFILE, &rl) != 0 || rl.rlim_cur >= rl.rlim_max) return;
  const rlim_t was = rl.rlim_cur;
  rl.rlim_cur = rl.rlim_max;
  if (setrlimit(RLIMIT_NOFILE, &rl) == 0)
    TCE_LOG(kInfo, "daemon") << "raised the open-file limit from " << was << " to " << rl.rlim_cur;
}

// A root server reads and writes storage for its clients as their fsuid and
// fsgid (env/fs_identity.h); the kernel then checks its supplementary groups
// too, which would lend every client the server's own groups (root's, in a
// container often several more). A root server keeps none.
static void DropSupplementaryGroups() {
  if (geteuid() != 0 || getgroups(0, nullptr) == 0) return;
  if (setgroups(0, nullptr) != 0)
    TCE_LOG(kWarning, "daemon") << "cannot drop the supplementary groups (" << std::strerror(errno)
                                << "): storage access for clients is also checked against them";
}

void PrepareProcess() {
  RaiseFdLimit();
  DropSupplementaryGroups();
}

// Removes a stale socket file; refuses if a live server answers on it.
Status ClaimSocket(const std::string& path, int type) {
  struct stat st;
  if (lstat(path.c_str(), &st) != 0) return Status::OK();
  if (!S_ISSOCK(st.st_mode)) return Status::FailedPrecondition(path + " exists and is not a socket");
  int fd = socket(AF_UNIX, type | SOCK_CLOEXEC, 0);
  struct sockaddr_un addr;
  std::memset(&addr, 0, sizeof(addr));
  addr.sun_family = AF_UNIX;
  std::strncpy(addr.sun_path, path.c_str(), sizeof(addr.sun_path) - 1);
  int rc = connect(fd, reinterpret_cast<struct sockaddr*>(&addr), sizeof(addr));
  close(fd);
  if (rc == 0) return Status::FailedPrecondition("another tce-server is listening on " + path);
  if (unlink(path.c_str()) != 0) return Status::FromErrno(errno, "unlink stale " + path);
  TCE_LOG(kInfo, "daemon") << "removed stale socket " << path;
  return Status::OK();
}

// Graceful shutdown: refuse new saves, then wait until what is cached is
// persisted (and backed up where there is a ring), the deadline passes, or
// another signal arrives. What is left is logged, one line per file.
void Drain(Cache* cache, const sigset_t* signals, std::chrono::milliseconds limit) {
  cache->StopAccepting();
  Clock* const clock = Clock::Real();  // real time: sigtimedwait waits in it
  const auto deadline = clock->Now() + limit;
  std::vector<std::string> left;
  bool in_flight = false;
  const char* why = "drained";
  for (;;) {
    left = cache->Unfinished(&in_flight);
    if (left.empty() && !in_flight) break;
    const auto now = clock->Now();
    if (now >= deadline) {
      why = "drain deadline passed";
      break;
    }
    const auto wait = std::min<Clock::Duration>(deadline - now, std::chrono::milliseconds(100));
    timespec ts{};
    ts.tv_nsec = std::chrono::duration_cast<std::chrono::nanoseconds>(wait).count();
    if (sigtimedwait(signals, nullptr, &ts) > 0) {
      why = "second signal";
      break;
    }
  }
  if (left.empty() && !in_flight) {
    TCE_LOG(kInfo, "daemon") << why << ": 0 file(s) unfinished";
  } else {
    TCE_LOG(kWarning, "daemon") << why << ": " << left.size() << " file(s) unfinished"
                                << (in_flight ? ", saves in flight" : "");
  }
  for (const std::string& f : left) TCE_LOG(kWarning, "daemon") << "unfinished at shutdown: " << f;
}

// Every environment variable, for the TCE_* overrides of the settings.
std::map<std::string, std::string> Environment() {
  std::map<std::string, std::string> env;
  for (char** e = environ; *e; ++e) {
    const char* eq = std::strchr(*e, '=');
    if (eq) env[std::string(*e, eq - *e)] = eq + 1;
  }
  return env;
}

// Does `action` (anything but running the daemon); returns the exit code.
int RunAction(Action action, const Options& opt) {
  switch (action) {
    case Action::kHelp: std::cout << HelpText(); return 0;
    case Action::kVersion: std::cout << "tce-server " << TCE_VERSION << "\n"; return 0;
    case Action::kPrintConfig: std::cout << FormatConfig(opt); return 0;
    case Action::kFabricInfo: {
      const char* lws = std::getenv("LOCAL_WORLD_SIZE");
      std::string json;
      Status s = FabricInfo(opt.ofi_provider, lws ? std::max(1, std::atoi(lws)) : 1, &json);
      if (!s.ok()) return Fail("--fabric-info: " + s.message(), 2);
      std::cout << json;
      return 0;
    }
    case Action::kRun: break;
  }
  return 0;
}

}  // namespace tce
