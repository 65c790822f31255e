#include "daemon/daemon.h"

#include <grpcpp/grpcpp.h>
#include <grp.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>
#include <zlib.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <fstream>
#include <functional>
#include <iostream>
#include <memory>

#include "cache/buffer_pool.h"
#include "cache/cache.h"
#include "cache/memory_backing.h"
#include "cache/memory_limits.h"
#include "common/logging.h"
#include "common/net.h"
#include "common/strings.h"
#include "daemon/metrics_endpoint.h"
#include "daemon/options.h"
#include "daemon/settings.h"
#include "meta/meta_store.h"
#include "ring/backup_store.h"
#include "ring/link_breaker.h"
#include "ring/peer_server.h"
#include "ring/range_reader.h"
#include "ring/replicator.h"
#include "ring/ring_fetch.h"
#include "ring/fabric_select.h"
#include "ring/transport_factory.h"
#include "meta/meta_writer.h"
#include "persist/persister.h"
#include "rpc/control_listener.h"
#include "rpc/fd_server.h"
#include "rpc/health_service.h"
#include "rpc/parse_errors.h"
#include "rpc/service.h"

extern char** environ;

namespace tce {
namespace {

// This server's temp-file prefix, from its identity (server_id: the host and
// socket by default), so servers sharing a directory (a shared filesystem)
// never take each other's temp files for their own.
std::string TempPrefix(const std::string& id) {
  const uint32_t crc = static_cast<uint32_t>(crc32(0L, reinterpret_cast<const Bytef*>(id.data()),
                                                   static_cast<uInt>(id.size())));
  char hex[9];
  snprintf(hex, sizeof(hex), "%08x", crc);
  return std::string(".tce-") + hex + ".";
}

int Fail(const std::string& msg, int code) {
  std::cerr << "tce-server: " << msg << std::endl;
  return code;
}

// Creates `dir` and its missing parents (0755); `dir` itself gets `mode`.
// Returns whether it was created (an existing directory is left as it is).
Status MkdirP(const std::string& dir, mode_t mode = 0755, bool* created = nullptr) {
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
void RaiseFdLimit() {
  struct rlimit rl;
  if (getrlimit(RLIMIT_NOFILE, &rl) != 0 || rl.rlim_cur >= rl.rlim_max) return;
  const rlim_t was = rl.rlim_cur;
  rl.rlim_cur = rl.rlim_max;
  if (setrlimit(RLIMIT_NOFILE, &rl) == 0)
    TCE_LOG(kInfo, "daemon") << "raised the open-file limit from " << was << " to " << rl.rlim_cur;
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
  const auto deadline = std::chrono::steady_clock::now() + limit;
  std::vector<std::string> left;
  bool in_flight = false;
  const char* why = "drained";
  for (;;) {
    left = cache->Unfinished(&in_flight);
    if (left.empty() && !in_flight) break;
    const auto now = std::chrono::steady_clock::now();
    if (now >= deadline) {
      why = "drain deadline passed";
      break;
    }
    const auto wait = std::min<std::chrono::steady_clock::duration>(deadline - now, std::chrono::milliseconds(100));
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

// Logs, once the daemon's objects are gone, how long their teardown after
// "stopped" took: mostly the cache's memory going back to the kernel (tens
// of ms per GiB of 4 KiB pages: seconds for a large budget), which the pod's
// grace period must cover too.
class ExitLog {
 public:
  ~ExitLog() {
    if (!armed_) return;
    const auto took = std::chrono::duration_cast<std::chrono::milliseconds>(
        std::chrono::steady_clock::now() - since_);
    TCE_LOG(kInfo, "daemon") << "exited teardown_ms=" << took.count() << " memory_bytes=" << bytes_;
  }
  // From now; `bytes`: the cache memory the teardown gives back.
  void Arm(uint64_t bytes) {
    armed_ = true;
    bytes_ = bytes;
    since_ = std::chrono::steady_clock::now();
  }

 private:
  bool armed_ = false;
  uint64_t bytes_ = 0;
  std::chrono::steady_clock::time_point since_;
};

}  // namespace

int RunDaemon(int argc, char** argv, const DaemonHooks& hooks) {
  std::map<std::string, std::string> env;
  for (char** e = environ; *e; ++e) {
    const char* eq = std::strchr(*e, '=');
    if (eq) env[std::string(*e, eq - *e)] = eq + 1;
  }
  Options opt;
  Action action;
  Status s = ParseOptions(std::vector<std::string>(argv + 1, argv + argc), env, &opt, &action);
  if (!s.ok()) return Fail(s.message(), 2);
  switch (action) {
    case Action::kHelp: std::cout << HelpText(); return 0;
    case Action::kVersion: std::cout << "tce-server " << TCE_VERSION << "\n"; return 0;
    case Action::kPrintConfig: std::cout << FormatConfig(opt); return 0;
    case Action::kFabricInfo: {
      const char* lws = std::getenv("LOCAL_WORLD_SIZE");
      std::string json;
      s = FabricInfo(opt.ofi_provider, lws ? std::max(1, std::atoi(lws)) : 1, &json);
      if (!s.ok()) return Fail("--fabric-info: " + s.message(), 2);
      std::cout << json;
      return 0;
    }
    case Action::kRun: break;
  }
  ExitLog exit_log;  // destroyed last, after everything below
  LogLevel level;
  ParseLogLevel(opt.log_level, &level);
  SetLogLevel(level);
  LogFormat format;
  ParseLogFormat(opt.log_format, &format);
  SetLogFormat(format);
  uint64_t budget;
  const MemoryLimits limits = DetectMemoryLimits("");
  s = ResolveBudget(opt.memory_budget, limits, &budget);
  if (!s.ok()) return Fail("memory_budget: " + s.message(), 2);
  Backing backing;
  std::string backing_why;
  if (!(s = ResolveBacking(opt.memory_backing, limits, &backing, &backing_why)).ok())
    return Fail(s.message(), 2);
  std::set<uid_t> uids;
  s = ParseUids(opt.allowed_uids, getuid(), &uids);
  if (!s.ok()) return Fail("allowed_uids: " + s.message(), 2);
  gid_t socket_gid;
  if (!(s = ResolveGroup(opt.socket_group, &socket_gid)).ok()) return Fail("socket_group: " + s.message(), 2);
  RaiseFdLimit();

  // Signals are taken by sigwait below; every thread inherits this mask.
  sigset_t stop;
  sigemptyset(&stop);
  sigaddset(&stop, SIGTERM);
  sigaddset(&stop, SIGINT);
  pthread_sigmask(SIG_BLOCK, &stop, nullptr);
  signal(SIGPIPE, SIG_IGN);

  const std::string fd_path = opt.socket + ".fd";
  size_t slash = opt.socket.rfind('/');
  // A socket directory the server creates is 0750, group socket_group: only
  // the group's members reach the sockets (which are 0660 themselves).
  const std::string socket_dir = opt.socket.substr(0, slash);
  bool created = false;
  if (!(s = MkdirP(socket_dir, 0750, &created)).ok()) return Fail(s.message(), 1);
  if (created && socket_gid != static_cast<gid_t>(-1) && chown(socket_dir.c_str(), -1, socket_gid) != 0)
    return Fail("chown " + socket_dir + ": " + std::strerror(errno), 1);
  if (!(s = ClaimSocket(opt.socket, SOCK_STREAM)).ok()) return Fail(s.message(), 1);
  if (!(s = ClaimSocket(fd_path, SOCK_SEQPACKET)).ok()) return Fail(s.message(), 1);

  std::vector<std::string> roots;
  if (!(s = ParseRoots(opt.storage_roots, &roots)).ok()) return Fail("storage_roots: " + s.message(), 2);
  for (const std::string& root : roots) {  // never created: a missing root is a missing mount
    struct stat st;
    const bool exists = stat(root.c_str(), &st) == 0;
    if (!exists || !S_ISDIR(st.st_mode))
      return Fail("storage_roots: " + root + (exists ? " is not a directory" : " does not exist") +
                      ": the server never creates a storage root (mount or create it first, or leave it out)",
                  2);
  }
  // The ring: a share of the budget holds the predecessor's backups.
  const bool ring = !opt.peer_listen.empty();
  std::string token = opt.peer_token;
  if (ring && !opt.peer_token_file.empty()) {
    std::ifstream in(opt.peer_token_file);
    if (!in) return Fail("peer_token_file: cannot read " + opt.peer_token_file, 2);
    std::getline(in, token);
  }
  if (ring && token.empty())
    return Fail("peer_listen needs a cluster token: set peer_token or peer_token_file", 2);
  PeerKey peer_key = token;
  const int certs = !opt.peer_cert_file.empty() + !opt.peer_key_file.empty() + !opt.peer_ca_file.empty();
  if (certs != 0 && certs != 3)
    return Fail("node certificates need peer_cert_file, peer_key_file and peer_ca_file, all three", 2);
  if (ring && certs == 3) {
    s = NodeCert::Load(opt.peer_cert_file, opt.peer_key_file, opt.peer_ca_file, &peer_key.cert);
    if (!s.ok()) return Fail(s.message(), 2);
  }
  const uint64_t backup_budget = ring ? budget / 100 * static_cast<uint64_t>(opt.backup_share) : 0;
  budget -= backup_budget;
  std::unique_ptr<Transport> transport;
  if (ring) {
    TransportOptions to;
    to.name = opt.ring_transport;
    to.ofi_provider = opt.ofi_provider;
    to.streams = opt.ring_streams;
    std::string variable;
    to.ofi_devices = DeviceSpecFromEnv(&variable);
    int ignored_port;
    if (!ParseEndpoint(opt.peer_advertise.empty() ? opt.peer_listen : opt.peer_advertise,
                       &to.source_host, &ignored_port).ok())
      to.source_host.clear();
    if (to.source_host == "0.0.0.0" || to.source_host == "::") to.source_host.clear();
    to.io_timeout = std::chrono::milliseconds(opt.peer_timeout_ms);
    if (!(s = NewTransport(to, &transport)).ok())
      return Fail("ring_transport " + opt.ring_transport + ": " + s.message(), 2);
  }
  if (ring && hooks.wrap_transport) transport = hooks.wrap_transport(std::move(transport));
  uint64_t prealloc = 0;
  std::string prealloc_why;
  if (!(s = ResolvePrealloc(opt.prealloc, budget, limits, backing == Backing::kHugetlb, &prealloc,
                            &prealloc_why)).ok())
    return Fail("prealloc: " + s.message(), 2);
  BackupStore backups(backup_budget);
  Cache cache(budget, roots, Env::Default(), std::chrono::milliseconds(opt.cache_full_timeout_ms),
              static_cast<size_t>(opt.keep_last));
  // Destroyed before the cache it counts its bytes in.
  std::unique_ptr<BufferPool> pool;
  if (prealloc > 0) pool = std::make_unique<BufferPool>(prealloc, backing, &cache);
  cache.SetMemory(backing, pool.get());
  TCE_LOG(kInfo, "daemon") << backing_why;
  if (pool)
    TCE_LOG(kInfo, "daemon") << "prealloc=" << opt.prealloc << ": " << HumanBytes(prealloc) << " ("
                             << prealloc_why << ")";
  cache.SetStorageCheckTimeout(std::chrono::milliseconds(opt.storage_check_timeout_ms));
  cache.SetRestoreWait(std::chrono::milliseconds(opt.ring_restore_wait_ms));
  cache.SetSessionLimits(SessionLimits{opt.root_is_admin, static_cast<size_t>(opt.max_leases_per_session)});
  PersistOptions popt;
  popt.threads = opt.persist_threads;
  popt.retries = opt.persist_retries;
  popt.backoff = std::chrono::milliseconds(opt.persist_backoff_ms);
  popt.direct_io = opt.persist_direct_io;
  popt.io_depth = opt.persist_io_depth;
  popt.failed_retry = std::chrono::milliseconds(opt.persist_failed_retry_ms);
  popt.temp_prefix = TempPrefix(EffectiveServerId(opt));
  TransferMetrics persist_metrics, backup_metrics;
  popt.metrics = &persist_metrics;
  // Metadata: re-index what was recorded before a restart, remove the temp
  // files of persists that a crash interrupted, then record every change.
  const std::string meta_url = EffectiveMetadataUrl(opt);
  std::unique_ptr<MetaWriter> meta;
  std::vector<RingInfo> recorded_rings;
  if (!meta_url.empty()) {
    if (!(s = MkdirP(opt.state_dir)).ok()) return Fail("state_dir: " + s.message(), 2);
    std::unique_ptr<MetaStore> store;
    const std::string server_id = EffectiveServerId(opt);
    if (!(s = OpenMetaStore(meta_url, &store, server_id)).ok()) return Fail("metadata_url: " + s.ToString(), 2);
    std::vector<FileInfo> recorded;
    if (!(s = store->LoadFiles(&recorded)).ok()) return Fail("metadata: " + s.ToString(), 1);
    std::vector<TagInfo> tags;
    if (!(s = store->LoadTags(&tags)).ok()) return Fail("metadata: " + s.ToString(), 1);
    cache.RestoreTags(std::move(tags));
    // The rings this server was told before a restart (found by its peer
    // endpoint, so only a fixed one finds them).
    if (ring && !(s = store->LoadRings(opt.peer_advertise.empty() ? opt.peer_listen : opt.peer_advertise,
                                       &recorded_rings)).ok())
      return Fail("metadata: " + s.ToString(), 1);
    // Temp files a crash left beside any recorded file (any version of it),
    // found only by this server's temp prefix and removed without following
    // a symlink.
    std::vector<std::string> recorded_paths;
    for (const FileInfo& f : recorded) recorded_paths.push_back(f.path);
    Persister::RemoveStaleTemps(Env::Default(), cache.storage_roots(), recorded_paths, popt.temp_prefix);
    meta = std::make_unique<MetaWriter>(std::move(store), server_id, getpid());
    meta->SetResync([&cache] { cache.RecordAll(); });
    cache.SetMetaSink(meta.get());
    cache.Restore(std::move(recorded));
    meta->Start();
  }
  Persister persister(&cache, Env::Default(), popt);
  if (cache.persistence_enabled()) persister.Start();
  LinkBreaker peer_links;  // our links to peers: broken at shutdown, so no peer holds it
  std::unique_ptr<PeerServer> peers;
  std::unique_ptr<Replicator> replicator;
  std::unique_ptr<RingFetch> ring_fetch;
  if (ring) {
    PeerServerOptions po;
    po.listen = opt.peer_listen;
    po.advertise = opt.peer_advertise;
    po.key = peer_key;
    po.io_timeout = std::chrono::milliseconds(opt.peer_timeout_ms);
    po.handshake_timeout = std::chrono::milliseconds(opt.peer_handshake_timeout_ms);
    po.max_connections = opt.peer_max_connections;
    po.max_handshakes = opt.peer_max_handshakes;
    po.max_handshakes_per_source = opt.peer_max_handshakes_per_source;
    peers = std::make_unique<PeerServer>(po, transport.get(), &backups, &cache);
    if (!(s = peers->Start()).ok()) return Fail("peer_listen: " + s.ToString(), 1);
    ReplicatorOptions ro;
    ro.self = peers->endpoint();
    ro.key = peer_key;
    ro.threads = opt.backup_threads;
    ro.io_timeout = std::chrono::milliseconds(opt.peer_timeout_ms);
    ro.metrics = &backup_metrics;
    ro.held = &backups;
    ro.breaker = &peer_links;
    replicator = std::make_unique<Replicator>(&cache, transport.get(), ro);
    replicator->Start();
    cache.SetSelfEndpoint(peers->endpoint());
    Replicator* r = replicator.get();
    ring_fetch = std::make_unique<RingFetch>(
        &cache, [r](const std::string& job, const std::string& path) { return r->FetchForLoad(job, path); });
    cache.RestoreRings(std::move(recorded_rings));
  }
  CacheService service(&cache, opt.socket, meta.get(), RedactUrl(meta_url), &backups,
                       peers ? peers->endpoint() : "");
  if (ring) service.SetRing(ring_fetch.get(), opt.ring_transport);
  RangeReaderOptions rro;  // ranged reads: this cache, then (with a ring) the ring's
  if (ring) {
    rro.self = peers->endpoint();
    rro.key = peer_key;
    rro.io_timeout = std::chrono::milliseconds(opt.peer_timeout_ms);
    rro.held = &backups;
    rro.breaker = &peer_links;
  }
  RangeReader ranges(&cache, rro);
  service.SetRangeReader(&ranges);
  // ReadRange into the session's buffer (the fd socket hands it out), its
  // bytes within the cache's budget.
  RangeBuffers range_buffers(&cache, static_cast<size_t>(opt.max_range_buffers_per_uid));
  service.SetRangeBuffers(&range_buffers);
  service.SetMaxWaits(static_cast<size_t>(opt.max_waits));
  service.SetMaxPeerCalls(static_cast<size_t>(opt.max_peer_calls),
                          static_cast<size_t>(opt.max_peer_calls_per_uid));
  // Operations: Prometheus metrics over HTTP, and the standard gRPC health
  // service over TCP (for probes; the cache service stays on the Unix socket).
  std::unique_ptr<MetricsServer> metrics;
  if (!opt.metrics_listen.empty()) {
    metrics = std::make_unique<MetricsServer>(opt.metrics_listen, [&] {
      v1::StatusResponse st;
      service.FillStatus(&st);
      return RenderMetrics(st, cache.Stats(), persist_metrics, backup_metrics);
    });
    if (!(s = metrics->Start()).ok()) return Fail("metrics_listen: " + s.ToString(), 1);
  }
  // Readiness ("" and the cache service): serving from when the sockets
  // accept until a drain begins. Liveness ("liveness"): serving while the
  // process runs, drain included, so a probe never kills a drain.
  HealthStates health_states;
  auto set_ready = [&](bool ready) {
    health_states.Set("", ready);
    health_states.Set(v1::Cache::service_full_name(), ready);
    health_states.Set("liveness", true);
  };
  set_ready(false);
  HealthService health_on_tcp(&health_states), health_on_socket(&health_states);
  std::unique_ptr<grpc::Server> health;
  std::string health_endpoint;
  if (!opt.health_listen.empty()) {
    grpc::ServerBuilder hb;
    int port = 0;
    hb.AddListeningPort(opt.health_listen, grpc::InsecureServerCredentials(), &port);
    hb.RegisterService(&health_on_tcp);
    hb.SetSyncServerOption(grpc::ServerBuilder::SyncServerOption::MAX_POLLERS, 2);
    // Unauthenticated callers: a bounded pool (a call beyond it is
    // RESOURCE_EXHAUSTED), room for Checks beside the capped Watch streams.
    grpc::ResourceQuota health_quota("tce-health");
    health_quota.SetMaxThreads(4 * HealthService::kMaxWatches);
    hb.SetResourceQuota(health_quota);
    health = hb.BuildAndStart();
    if (!health || port == 0) return Fail("health_listen: cannot listen on " + opt.health_listen, 1);
    health_endpoint = WithPort(opt.health_listen, port);
    TCE_LOG(kInfo, "daemon") << "serving gRPC health at " << health_endpoint;
  }
  service.SetEndpoints(metrics ? metrics->endpoint() : "", health_endpoint);
  grpc::ServerBuilder builder;
  // No listening port: ControlListener accepts on the socket and hands each
  // allowed connection to gRPC (whose own listener dies on one EMFILE).
  builder.RegisterService(&service);
  builder.RegisterService(&health_on_socket);
  // A request gRPC cannot parse (a string that is not UTF-8) is refused as
  // INVALID_ARGUMENT naming the field, not INTERNAL with no message.
  InstallProtobufLogHandler();
  std::vector<std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>> interceptors;
  interceptors.push_back(NewParseErrorInterceptorFactory());
  builder.experimental().SetInterceptorCreators(std::move(interceptors));
  builder.SetSyncServerOption(grpc::ServerBuilder::SyncServerOption::MIN_POLLERS, 1);
  builder.SetSyncServerOption(grpc::ServerBuilder::SyncServerOption::MAX_POLLERS, opt.rpc_threads);
  // One thread per running call. The calls that block are capped
  // (max_waits, max_peer_calls); the rest end at once and share
  // kQuickCallThreads. A call beyond the pool is RESOURCE_EXHAUSTED: a
  // flood of calls cannot take every thread of the process.
  constexpr int kQuickCallThreads = 64;
  grpc::ResourceQuota control_quota("tce-control");
  control_quota.SetMaxThreads(opt.rpc_threads + opt.max_waits + opt.max_peer_calls + kQuickCallThreads);
  builder.SetResourceQuota(control_quota);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (!server) return Fail("cannot start the gRPC server", 1);
  ControlListener control(server.get(), opt.socket, uids, socket_gid,
                          static_cast<size_t>(opt.max_control_connections),
                          static_cast<size_t>(opt.max_control_connections_per_uid));
  if (!(s = control.Start()).ok()) {
    server->Shutdown();
    return Fail(s.message(), 1);
  }
  FdServerOptions fo;
  fo.path = fd_path;
  fo.allowed_uids = uids;
  fo.max_sessions = static_cast<size_t>(opt.max_sessions);
  fo.max_sessions_per_uid = static_cast<size_t>(opt.max_sessions_per_uid);
  fo.idle_timeout = std::chrono::seconds(opt.session_idle_timeout_s);
  fo.socket_gid = socket_gid;
  FdServer fds(&cache, fo);
  fds.SetRangeBuffers(&range_buffers);
  if (!(s = fds.Start()).ok()) {
    control.Stop();
    server->Shutdown();
    unlink(opt.socket.c_str());
    return Fail(s.message(), 1);
  }
  set_ready(true);
  if (pool) pool->Start();  // fills in the background while the server serves
  TCE_LOG(kInfo, "daemon") << "ready socket=" << opt.socket << " budget=" << budget << " ("
                           << HumanBytes(budget) << ") storage_roots="
                           << (roots.empty() ? "(none: memory only)" : opt.storage_roots)
                           << " pid=" << getpid();

  int sig = 0;
  sigwait(&stop, &sig);
  TCE_LOG(kInfo, "daemon") << "received " << strsignal(sig) << ", draining (at most "
                           << opt.drain_timeout_ms << " ms; a second signal stops at once)";
  set_ready(false);
  if (pool) pool->Stop();  // its memory goes back now, not after the drain
  Drain(&cache, &stop, std::chrono::milliseconds(opt.drain_timeout_ms));
  persister.Stop();  // wakes Wait() callers before the RPC server drains
  // What still waits on a peer (a backup, a restore, a ranged read or a
  // fetch for a load: each up to peer_timeout_ms, a restore wait up to
  // ring_restore_wait_ms) would hold the threads joined below: end it now.
  cache.StopRestoreWaits();
  if (ring) {
    const size_t broken = peer_links.BreakAll();
    TCE_LOG(kInfo, "daemon") << "stopping: broke " << broken << " link(s) to peers";
  }
  if (replicator) replicator->Stop();
  if (peers) peers->Stop();
  health_states.Shutdown();  // ends Watch streams, which would hold the shutdowns
  control.Stop();
  server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2));
  if (health) health->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(1));
  if (metrics) metrics->Stop();
  fds.Stop();
  if (meta) meta->Stop();
  unlink(opt.socket.c_str());
  unlink(fd_path.c_str());
  TCE_LOG(kInfo, "daemon") << "stopped";
  exit_log.Arm(cache.Stats().used + backups.Stats().bytes);
  return 0;
}

}  // namespace tce
