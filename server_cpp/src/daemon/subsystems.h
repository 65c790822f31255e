// Daemon: the running tce-server, its subsystems and the order they start
// and stop in. RunDaemon (daemon.cc) calls its methods in start order: the
// settings, sockets, storage and the ring's key and transport, then the
// cache, metadata, persister and ring (daemon.cc), then what clients and
// probes reach: the cache service, metrics, health, the control socket and
// the fd socket (daemon_endpoints.cc). Internal to the daemon folder.
#pragma once

#include <grpcpp/grpcpp.h>
#include <signal.h>
#include <sys/types.h>

#include <cstdint>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "daemon/daemon.h"
#include "daemon/component_options.h"
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

// The running daemon: its subsystems, each started by one method, in the
// order RunDaemon calls them. A method that fails has printed why and returns
// the exit code (0: started). The members are declared in start order, so
// whenever RunDaemon returns (a refusal halfway included) each subsystem is
// destroyed before what it uses. Shutdown() stops them first, in the order
// its comments give. Its methods are called from RunDaemon's thread only.
class Daemon {
 public:
  Daemon(const Options& opt, const DaemonHooks& hooks)
      : opt_(opt), hooks_(hooks), fd_path_(opt.socket + ".fd"), popt_(PersistSettings(opt)) {
    popt_.metrics = &persist_metrics_;
  }

  int ReadSettings();
  void BlockStopSignals();
  int ClaimSockets();
  int CheckStorageRoots();
  int ReadRingKey();
  int MakeTransport();
  int MakeCache();
  int OpenMetadata();
  void RestoreFromMetadata();
  void StartPersister();
  int StartRing();
  void MakeService();
  int StartMetrics();
  int StartHealth();
  int StartControl();
  int StartFdSocket();
  void ServeUntilSignal();
  void Shutdown();

  // The memory the daemon's teardown gives back to the kernel.
  uint64_t MemoryBytes() const { return cache_->Stats().used + backups_->Stats().bytes; }

 private:
  void SetReady(bool ready);
  void StopRing();

  const Options& opt_;
  const DaemonHooks& hooks_;
  const std::string fd_path_;  // the socket that hands out memfds

  // Settings, resolved by ReadSettings.
  uint64_t budget_ = 0;  // the cache's, once MakeCache took the backups' share
  MemoryLimits limits_;
  Backing backing_ = Backing::k4k;
  std::string backing_why_;
  std::set<uid_t> uids_;
  gid_t socket_gid_ = static_cast<gid_t>(-1);
  sigset_t stop_{};  // SIGTERM and SIGINT, taken by sigwait
  std::shared_ptr<StorageRoots> storage_;  // every root: the cache's, the persister's, the retention's

  // The ring: a share of the budget holds the predecessor's backups.
  bool ring_ = false;
  PeerKey peer_key_;
  std::unique_ptr<Transport> transport_;

  // Memory.
  std::unique_ptr<BackupStore> backups_;
  // Made before the cache, which feeds it; the persister takes from it.
  std::unique_ptr<PersistQueue> persist_queue_;
  // Made before the cache, which feeds it (with a ring); the replicator
  // takes from it.
  std::unique_ptr<BackupQueue> backup_queue_;
  // Made before the cache, which tells it each complete tag; the storage
  // retention takes from it.
  std::unique_ptr<RetentionQueue> retention_queue_;
  std::unique_ptr<Cache> cache_;

  // Persistence and metadata.
  PersistOptions popt_;
  TransferMetrics persist_metrics_, backup_metrics_;
  std::string meta_url_;
  std::unique_ptr<MetaWriter> meta_;
  std::vector<RingInfo> recorded_rings_;  // from the metadata, for StartRing
  std::vector<FileInfo> recorded_files_;  // ... for the cache (RestoreFromMetadata)
  std::vector<TagInfo> recorded_tags_;
  std::unique_ptr<StorageRetention> retention_;
  std::unique_ptr<Persister> persister_;

  // The ring's servers.
  LinkBreaker peer_links_;  // our links to peers: broken at shutdown, so no peer holds it
  std::unique_ptr<PeerServer> peers_;
  std::unique_ptr<Replicator> replicator_;
  std::unique_ptr<RingFetch> ring_fetch_;

  // The RPC service and what serves it.
  std::unique_ptr<CacheService> service_;
  std::unique_ptr<RangeReader> ranges_;
  std::unique_ptr<VersionFollower> follower_;  // with a ring: followed jobs' versions
  std::unique_ptr<RangeBuffers> range_buffers_;
  std::unique_ptr<MetricsServer> metrics_;
  HealthStates health_states_;
  std::unique_ptr<HealthService> health_on_tcp_, health_on_socket_;
  std::unique_ptr<grpc::Server> health_;
  std::string health_endpoint_;
  std::unique_ptr<grpc::Server> server_;
  std::unique_ptr<ControlListener> control_;
  std::unique_ptr<FdServer> fds_;
};

}  // namespace tce
