#include "daemon/daemon.h"
#include "daemon/component_options.h"

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
#include "common/clock.h"
#include "common/logging.h"
#include "common/net.h"
#include "common/strings.h"
#include "daemon/metrics_endpoint.h"
#include "daemon/options.h"
#include "daemon/process.h"
#include "daemon/settings.h"
#include "daemon/subsystems.h"
#include "meta/meta_store.h"
#include "ring/backup_store.h"
#include "ring/link_breaker.h"
#include "ring/version_follower.h"
#include "ring/peer_server.h"
#include "ring/range_reader.h"
#include "ring/replicator.h"
#include "ring/ring_fetch.h"
#include "ring/fabric_select.h"
#include "ring/transport_factory.h"
#include "meta/meta_writer.h"
#include "persist/persister.h"
#include "persist/storage_retention.h"
#include "rpc/control_listener.h"
#include "rpc/fd_server.h"
#include "rpc/health_service.h"
#include "rpc/parse_errors.h"
#include "rpc/service.h"

namespace tce {

// Logging, the memory budget and backing, who may connect, the fd limit.
int Daemon::ReadSettings() {
  LogLevel level;
  ParseLogLevel(opt_.log_level, &level);
  SetLogLevel(level);
  LogFormat format;
  ParseLogFormat(opt_.log_format, &format);
  SetLogFormat(format);
  limits_ = DetectMemoryLimits("");
  Status s = ResolveBudget(opt_.memory_budget, limits_, &budget_);
  if (!s.ok()) return Fail("memory_budget: " + s.message(), 2);
  if (!(s = ResolveBacking(opt_.memory_backing, limits_, &backing_, &backing_why_)).ok())
    return Fail(s.message(), 2);
  s = ParseUids(opt_.allowed_uids, getuid(), &uids_);
  if (!s.ok()) return Fail("allowed_uids: " + s.message(), 2);
  if (!(s = ResolveGroup(opt_.socket_group, &socket_gid_)).ok()) return Fail("socket_group: " + s.message(), 2);
  PrepareProcess();
  return 0;
}

// Signals are taken by sigwait in ServeUntilSignal; every thread inherits
// this mask, so it is set before the first thread starts.
void Daemon::BlockStopSignals() {
  sigemptyset(&stop_);
  sigaddset(&stop_, SIGTERM);
  sigaddset(&stop_, SIGINT);
  pthread_sigmask(SIG_BLOCK, &stop_, nullptr);
  signal(SIGPIPE, SIG_IGN);
}

// The socket directory, and both sockets' paths (refused while a live server
// answers on one).
int Daemon::ClaimSockets() {
  size_t slash = opt_.socket.rfind('/');
  // A socket directory the server creates is 0750, group socket_group: only
  // the group's members reach the sockets (which are 0660 themselves).
  const std::string socket_dir = opt_.socket.substr(0, slash);
  bool created = false;
  Status s;
  if (!(s = MkdirP(socket_dir, 0750, &created)).ok()) return Fail(s.message(), 1);
  if (created && socket_gid_ != static_cast<gid_t>(-1) && chown(socket_dir.c_str(), -1, socket_gid_) != 0)
    return Fail("chown " + socket_dir + ": " + std::strerror(errno), 1);
  if (!(s = ClaimSocket(opt_.socket, SOCK_STREAM)).ok()) return Fail(s.message(), 1);
  if (!(s = ClaimSocket(fd_path_, SOCK_SEQPACKET)).ok()) return Fail(s.message(), 1);
  return 0;
}

int Daemon::CheckStorageRoots() {
  Status s = StorageRoots::Open(opt_.storage_roots, StorageSettings(opt_), &storage_);
  return s.ok() ? 0 : Fail("storage_roots: " + s.message(), 2);
}

// The cluster token (and node certificates) peers prove themselves with.
int Daemon::ReadRingKey() {
  ring_ = !opt_.peer_listen.empty();
  std::string token = opt_.peer_token;
  if (ring_ && !opt_.peer_token_file.empty()) {
    std::ifstream in(opt_.peer_token_file);
    if (!in) return Fail("peer_token_file: cannot read " + opt_.peer_token_file, 2);
    std::getline(in, token);
  }
  if (ring_ && token.empty())
    return Fail("peer_listen needs a cluster token: set peer_token or peer_token_file", 2);
  peer_key_ = token;
  const int certs = !opt_.peer_cert_file.empty() + !opt_.peer_key_file.empty() + !opt_.peer_ca_file.empty();
  if (certs != 0 && certs != 3)
    return Fail("node certificates need peer_cert_file, peer_key_file and peer_ca_file, all three", 2);
  if (ring_ && certs == 3) {
    Status s = NodeCert::Load(opt_.peer_cert_file, opt_.peer_key_file, opt_.peer_ca_file, &peer_key_.cert);
    if (!s.ok()) return Fail(s.message(), 2);
  }
  return 0;
}

// The ring's transport (none without a ring), wrapped by the hooks.
int Daemon::MakeTransport() {
  if (ring_) {
    Status s = NewTransport(MakeTransportOptions(opt_), &transport_);
    if (!s.ok()) return Fail("ring_transport " + opt_.ring_transport + ": " + s.message(), 2);
  }
  if (ring_ && hooks_.wrap_transport) transport_ = hooks_.wrap_transport(std::move(transport_));
  return 0;
}

// The budget split between the cache and the ring's backups, the cache and
// its memory (a preallocated pool, filled once serving).
int Daemon::MakeCache() {
  const uint64_t backup_budget = ring_ ? budget_ / 100 * static_cast<uint64_t>(opt_.backup_share) : 0;
  budget_ -= backup_budget;
  uint64_t prealloc = 0;
  std::string prealloc_why;
  Status s;
  if (!(s = ResolvePrealloc(opt_.prealloc, budget_, limits_, backing_ == Backing::kHugetlb, &prealloc,
                            &prealloc_why)).ok())
    return Fail("prealloc: " + s.message(), 2);
  backups_ = std::make_unique<BackupStore>(backup_budget);
  CacheOptions co(budget_);
  co.storage = storage_;
  co.full_timeout = std::chrono::milliseconds(opt_.cache_full_timeout_ms);
  co.keep_last = static_cast<size_t>(opt_.keep_last);
  co.storage_check_timeout = std::chrono::milliseconds(opt_.storage_check_timeout_ms);
  co.restore_wait = std::chrono::milliseconds(opt_.ring_restore_wait_ms);
  co.fetch_files = opt_.cooperative_restore;  // a node's ranks share one read of a file
  co.meta = meta_.get();
  co.backing = backing_;
  co.prealloc = prealloc;
  // The persistence queue first: the cache feeds it from its first commit,
  // the persister (made after the cache, which it asks) takes from it.
  popt_.storage = storage_;
  persist_queue_ = Persister::MakeQueue(popt_);
  co.persist_feed = persist_queue_.get();
  // Likewise the ring's queue (with a ring): the cache feeds it, the
  // replicator (made after the cache, which it asks) takes from it.
  if (ring_) backup_queue_ = std::make_unique<BackupQueue>();
  co.backup_feed = backup_queue_.get();
  // And the retention's queue of jobs with a new complete tag.
  retention_queue_ = std::make_unique<RetentionQueue>(opt_.storage_keep_last > 0);
  co.tag_feed = retention_queue_.get();
  std::string metadata_why;
  if (!(s = MakeSessionLimits(opt_, budget_ + backup_budget, limits_, &co.limits, &metadata_why)).ok())
    return Fail(s.message(), 2);
  TCE_LOG(kInfo, "daemon") << "metadata_budget=" << HumanBytes(co.limits.metadata.budget) << " (" << metadata_why
                           << ")";
  cache_ = std::make_unique<Cache>(std::move(co));
  retention_ = std::make_unique<StorageRetention>(cache_->persistence(), retention_queue_.get(), storage_,
                                                  opt_.storage_keep_last);
  TCE_LOG(kInfo, "daemon") << backing_why_;
  if (cache_->pool())
    TCE_LOG(kInfo, "daemon") << "prealloc=" << opt_.prealloc << ": " << HumanBytes(prealloc) << " ("
                             << prealloc_why << ")";
  return 0;
}

// Metadata, before the cache: read what was recorded before a restart,
// remove the temp files of persists that a crash interrupted, and make the
// writer every later change is recorded through (the cache's sink).
int Daemon::OpenMetadata() {
  meta_url_ = EffectiveMetadataUrl(opt_);
  if (meta_url_.empty()) return 0;
  Status s;
  if (!(s = MkdirP(opt_.state_dir, 0700)).ok()) return Fail("state_dir: " + s.message(), 2);  // the server's own
  std::unique_ptr<MetaStore> store;
  const std::string server_id = EffectiveServerId(opt_);
  if (!(s = OpenMetaStore(meta_url_, &store, server_id)).ok()) return Fail("metadata_url: " + s.ToString(), 2);
  if (!(s = store->LoadFiles(&recorded_files_)).ok()) return Fail("metadata: " + s.ToString(), 1);
  if (!(s = store->LoadTags(&recorded_tags_)).ok()) return Fail("metadata: " + s.ToString(), 1);
  // The rings this server was told before a restart (found by its peer
  // endpoint, so only a fixed one finds them).
  if (ring_ && !(s = store->LoadRings(opt_.peer_advertise.empty() ? opt_.peer_listen : opt_.peer_advertise,
                                      &recorded_rings_)).ok())
    return Fail("metadata: " + s.ToString(), 1);
  // Temp files a crash left beside any recorded file (any version of it),
  // found only by this server's temp prefix and removed without following
  // a symlink.
  std::vector<std::string> recorded_paths;
  for (const FileInfo& f : recorded_files_) recorded_paths.push_back(f.path);
  Persister::RemoveStaleTemps(*storage_, recorded_paths, TempPrefix(EffectiveServerId(opt_)));
  meta_ = std::make_unique<MetaWriter>(std::move(store), server_id, getpid());
  return 0;
}

// The cache re-indexes what metadata recorded, then the writer starts
// recording (and, when the database is lost, has the cache record it all
// again).
void Daemon::RestoreFromMetadata() {
  if (!meta_) return;
  Cache* cache = cache_.get();
  meta_->SetResync([cache] { cache->RecordAll(); });
  cache_->Restore(std::move(recorded_files_), std::move(recorded_tags_));
  meta_->Start();
}

// Made even without storage roots: Shutdown stops it either way.
void Daemon::StartPersister() {
  persister_ = std::make_unique<Persister>(cache_->persistence(), persist_queue_.get(), Env::Default(), popt_);
  if (!storage_->empty()) persister_->Start();
  storage_->objects().AbandonUnfinishedInBackground();  // a crashed run's uploads
  retention_->Start();
}

// The peer server (backups in), the replicator (backups out) and the fetch of
// a load from the ring; nothing without a ring.
int Daemon::StartRing() {
  if (!ring_) return 0;
  PeerServerOptions po;
  po.listen = opt_.peer_listen;
  po.advertise = opt_.peer_advertise;
  po.key = peer_key_;
  po.io_timeout = std::chrono::milliseconds(opt_.peer_timeout_ms);
  po.handshake_timeout = std::chrono::milliseconds(opt_.peer_handshake_timeout_ms);
  po.max_connections = opt_.peer_max_connections;
  po.max_handshakes = opt_.peer_max_handshakes;
  po.max_handshakes_per_source = opt_.peer_max_handshakes_per_source;
  peers_ = std::make_unique<PeerServer>(po, transport_.get(), backups_.get(), RingStores::Of(cache_.get()));
  Status s;
  if (!(s = peers_->Start()).ok()) return Fail("peer_listen: " + s.ToString(), 1);
  ReplicatorOptions ro;
  ro.self = peers_->endpoint();
  ro.key = peer_key_;
  ro.threads = opt_.backup_threads;
  ro.io_timeout = std::chrono::milliseconds(opt_.peer_timeout_ms);
  ro.metrics = &backup_metrics_;
  ro.held = backups_.get();
  ro.breaker = &peer_links_;
  ro.prefetch = opt_.restore_prefetch;
  ro.cooperative = opt_.cooperative_restore;
  replicator_ = std::make_unique<Replicator>(RingStores::Of(cache_.get()), backup_queue_.get(), transport_.get(), ro);
  replicator_->Start();
  cache_->rings()->SetSelfEndpoint(peers_->endpoint());
  Replicator* r = replicator_.get();
  ring_fetch_ = std::make_unique<RingFetch>(
      cache_.get(), cache_->rings(), cache_->restores(),
      [r](const std::string& job, const std::string& path, LoadFrom* from, Clock::TimePoint deadline) {
        return r->FetchForLoad(job, path, from, deadline);
      },
      [r](const std::string& job, const std::string& path, Clock::TimePoint deadline) {
        return r->LoadByPlan(job, path, /*stage=*/true, nullptr, deadline);
      });
  cache_->rings()->RestoreRings(std::move(recorded_rings_));
  return 0;
}

// Ready: serves until SIGTERM or SIGINT.
void Daemon::ServeUntilSignal() {
  SetReady(true);
  if (BufferPool* pool = cache_->pool()) pool->Start();  // fills in the background while the server serves
  TCE_LOG(kInfo, "daemon") << "ready socket=" << opt_.socket << " budget=" << budget_ << " ("
                           << HumanBytes(budget_) << ") storage_roots="
                           << (storage_->empty() ? "(none: memory only)" : storage_->Describe())
                           << " pid=" << getpid();
  int sig = 0;
  sigwait(&stop_, &sig);
  TCE_LOG(kInfo, "daemon") << "received " << strsignal(sig) << ", draining (at most "
                           << opt_.drain_timeout_ms << " ms; a second signal stops at once)";
}

// Drains, then stops every subsystem: not the reverse of their start, but in
// the order that lets each one's threads end.
void Daemon::Shutdown() {
  SetReady(false);
  if (BufferPool* pool = cache_->pool()) pool->Stop();  // its memory goes back now, not after the drain
  Drain(cache_.get(), &stop_, std::chrono::milliseconds(opt_.drain_timeout_ms));
  retention_->Stop();
  if (storage_) storage_->objects().CancelAll();  // transfers in flight end (their files stay FAILED)
  persister_->Stop();  // wakes Wait() callers before the RPC server drains
  // What still waits on a peer (a backup, a restore, a ranged read or a
  // fetch for a load: each up to peer_timeout_ms, a restore wait up to
  // ring_restore_wait_ms) would hold the threads joined below: end it now.
  cache_->StopWaits();
  StopRing();
  health_states_.Shutdown();  // ends Watch streams, which would hold the shutdowns
  control_->Stop();
  server_->Shutdown(Clock::Real()->WallNow() + std::chrono::seconds(2));
  if (health_) health_->Shutdown(Clock::Real()->WallNow() + std::chrono::seconds(1));
  if (metrics_) metrics_->Stop();
  fds_->Stop();
  if (meta_) meta_->Stop();
  unlink(opt_.socket.c_str());
  unlink(fd_path_.c_str());
  TCE_LOG(kInfo, "daemon") << "stopped";
}

void Daemon::StopRing() {
  if (ring_) {
    const size_t broken = peer_links_.BreakAll();
    TCE_LOG(kInfo, "daemon") << "stopping: broke " << broken << " link(s) to peers";
  }
  if (peers_) peers_->SetFollower(nullptr);
  if (follower_) follower_->Stop();  // (its links are broken: it ends at once)
  if (replicator_) replicator_->Stop();
  if (peers_) peers_->Stop();
}

int RunDaemon(int argc, char** argv, const DaemonHooks& hooks) {
  Options opt;
  Action action;
  Status s = ParseOptions(std::vector<std::string>(argv + 1, argv + argc), Environment(), &opt, &action);
  if (!s.ok()) return Fail(s.message(), 2);
  if (action != Action::kRun) return RunAction(action, opt);

  ExitLog exit_log;  // destroyed last, after the daemon's subsystems
  Daemon daemon(opt, hooks);
  if (int rc = daemon.ReadSettings()) return rc;
  daemon.BlockStopSignals();
  if (int rc = daemon.ClaimSockets()) return rc;
  if (int rc = daemon.CheckStorageRoots()) return rc;
  if (int rc = daemon.ReadRingKey()) return rc;
  if (int rc = daemon.MakeTransport()) return rc;
  if (int rc = daemon.OpenMetadata()) return rc;
  if (int rc = daemon.MakeCache()) return rc;
  daemon.RestoreFromMetadata();
  daemon.StartPersister();
  if (int rc = daemon.StartRing()) return rc;
  daemon.MakeService();
  if (int rc = daemon.StartMetrics()) return rc;
  if (int rc = daemon.StartHealth()) return rc;
  if (int rc = daemon.StartControl()) return rc;
  if (int rc = daemon.StartFdSocket()) return rc;
  daemon.ServeUntilSignal();
  daemon.Shutdown();
  exit_log.Arm(daemon.MemoryBytes());
  return 0;
}

}  // namespace tce
