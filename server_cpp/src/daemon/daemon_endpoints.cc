// What clients and probes reach (daemon/subsystems.h): the cache service
// and the readers it serves ranges and followed versions with, Prometheus
// metrics, gRPC health, the control socket and the fd socket.
#include <grpcpp/grpcpp.h>
#include <unistd.h>

#include <chrono>
#include <memory>

#include "common/logging.h"
#include "common/net.h"
#include "daemon/component_options.h"
#include "daemon/process.h"
#include "daemon/subsystems.h"
#include "meta/meta_store.h"
#include "rpc/parse_errors.h"

namespace tce {

// The cache service and what it reads ranges with; served by StartControl.
void Daemon::MakeService() {
  service_ = std::make_unique<CacheService>(ClientStores::Of(cache_.get()), opt_.socket, meta_.get(), RedactUrl(meta_url_),
                                            backups_.get(), peers_ ? peers_->endpoint() : "");
  if (ring_) service_->SetRing(ring_fetch_.get(), opt_.ring_transport, replicator_.get());
  RangeReaderOptions rro;  // ranged reads: this cache, then (with a ring) the ring's
  if (ring_) {
    rro.self = peers_->endpoint();
    rro.key = peer_key_;
    rro.io_timeout = std::chrono::milliseconds(opt_.peer_timeout_ms);
    rro.held = backups_.get();
    rro.breaker = &peer_links_;
    Replicator* r = replicator_.get();  // which peers stopped answering: one view for loads and ranges
    rro.is_down = [r](const std::string& job, const std::string& peer) { return r->PeerDown(job, peer); };
    rro.mark_down = [r](const std::string& job, const std::string& peer) { r->MarkPeerDown(job, peer); };
  }
  ranges_ = std::make_unique<RangeReader>(RingStores::Of(cache_.get()), rro);
  service_->SetRangeReader(ranges_.get());
  if (ring_) {  // following other nodes' published versions (docs/weights.md)
    VersionFollowerOptions fo;
    fo.self = peers_->endpoint();
    fo.key = peer_key_;
    fo.io_timeout = std::chrono::milliseconds(opt_.peer_timeout_ms);
    fo.breaker = &peer_links_;
    fo.max_jobs = opt_.max_follows, fo.max_jobs_per_uid = opt_.max_follows_per_uid;  // (settings: >= 1)
    follower_ = std::make_unique<VersionFollower>(cache_->replicas(), cache_->publication(), ranges_.get(), fo);
    service_->SetFollower(follower_.get());
    peers_->SetFollower(follower_.get());
  }
  // ReadRange into the session's buffer (the fd socket hands it out), its
  // bytes within the cache's budget.
  range_buffers_ = std::make_unique<RangeBuffers>(cache_->memory_budget(), static_cast<size_t>(opt_.max_range_buffers_per_uid));
  service_->SetRangeBuffers(range_buffers_.get());
  service_->SetMaxWaits(static_cast<size_t>(opt_.max_waits), static_cast<size_t>(opt_.max_waits_per_uid));
  service_->SetMaxPeerCalls(static_cast<size_t>(opt_.max_peer_calls),
                            static_cast<size_t>(opt_.max_peer_calls_per_uid));
}

// Operations: Prometheus metrics over HTTP (here), and the standard gRPC
// health service over TCP (StartHealth; for probes, the cache service stays
// on the Unix socket).
int Daemon::StartMetrics() {
  if (opt_.metrics_listen.empty()) return 0;
  metrics_ = std::make_unique<MetricsServer>(opt_.metrics_listen, [this] {
    v1::StatusResponse st;
    service_->FillStatus(&st);
    return RenderMetrics(st, cache_->Stats(), persist_metrics_, backup_metrics_);
  });
  Status s;
  if (!(s = metrics_->Start()).ok()) return Fail("metrics_listen: " + s.ToString(), 1);
  return 0;
}

// Readiness ("" and the cache service): serving from when the sockets
// accept until a drain begins. Liveness ("liveness"): serving while the
// process runs, drain included, so a probe never kills a drain.
void Daemon::SetReady(bool ready) {
  health_states_.Set("", ready);
  health_states_.Set(v1::Cache::service_full_name(), ready);
  health_states_.Set("liveness", true);
}

int Daemon::StartHealth() {
  SetReady(false);
  health_on_tcp_ = std::make_unique<HealthService>(&health_states_);
  health_on_socket_ = std::make_unique<HealthService>(&health_states_);
  if (!opt_.health_listen.empty()) {
    grpc::ServerBuilder hb;
    int port = 0;
    hb.AddListeningPort(opt_.health_listen, grpc::InsecureServerCredentials(), &port);
    hb.RegisterService(health_on_tcp_.get());
    hb.SetSyncServerOption(grpc::ServerBuilder::SyncServerOption::MAX_POLLERS, 2);
    // Unauthenticated callers: a bounded pool (a call beyond it is
    // RESOURCE_EXHAUSTED), room for Checks beside the capped Watch streams.
    grpc::ResourceQuota health_quota("tce-health");
    health_quota.SetMaxThreads(4 * HealthService::kMaxWatches);
    hb.SetResourceQuota(health_quota);
    health_ = hb.BuildAndStart();
    if (!health_ || port == 0) return Fail("health_listen: cannot listen on " + opt_.health_listen, 1);
    health_endpoint_ = WithPort(opt_.health_listen, port);
    TCE_LOG(kInfo, "daemon") << "serving gRPC health at " << health_endpoint_;
  }
  service_->SetEndpoints(metrics_ ? metrics_->endpoint() : "", health_endpoint_);
  return 0;
}

// The gRPC server of the cache service (and health) and the listener that
// accepts its connections on the control socket.
int Daemon::StartControl() {
  grpc::ServerBuilder builder;
  // No listening port: ControlListener accepts on the socket and hands each
  // allowed connection to gRPC (whose own listener dies on one EMFILE).
  builder.RegisterService(service_.get());
  builder.RegisterService(health_on_socket_.get());
  // A request gRPC cannot parse (a string that is not UTF-8) is refused as
  // INVALID_ARGUMENT naming the field, not INTERNAL with no message.
  InstallProtobufLogHandler();
  std::vector<std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>> interceptors;
  interceptors.push_back(NewParseErrorInterceptorFactory());
  builder.experimental().SetInterceptorCreators(std::move(interceptors));
  builder.SetSyncServerOption(grpc::ServerBuilder::SyncServerOption::MIN_POLLERS, 1);
  builder.SetSyncServerOption(grpc::ServerBuilder::SyncServerOption::MAX_POLLERS, opt_.rpc_threads);
  // One thread per running call. The calls that block are capped
  // (max_waits, max_peer_calls); the rest end at once and share
  // kQuickCallThreads. A call beyond the pool is RESOURCE_EXHAUSTED: a
  // flood of calls cannot take every thread of the process.
  constexpr int kQuickCallThreads = 64;
  grpc::ResourceQuota control_quota("tce-control");
  control_quota.SetMaxThreads(opt_.rpc_threads + opt_.max_waits + opt_.max_peer_calls + kQuickCallThreads);
  builder.SetResourceQuota(control_quota);
  server_ = builder.BuildAndStart();
  if (!server_) return Fail("cannot start the gRPC server", 1);
  control_ = std::make_unique<ControlListener>(server_.get(), opt_.socket, uids_, socket_gid_,
                                               static_cast<size_t>(opt_.max_control_connections),
                                               static_cast<size_t>(opt_.max_control_connections_per_uid));
  Status s;
  if (!(s = control_->Start()).ok()) {
    server_->Shutdown();
    return Fail(s.message(), 1);
  }
  return 0;
}

// The socket that hands out memfds (and range buffers) to sessions.
int Daemon::StartFdSocket() {
  FdServerOptions fo;
  fo.path = fd_path_;
  fo.allowed_uids = uids_;
  fo.max_sessions = static_cast<size_t>(opt_.max_sessions);
  fo.max_sessions_per_uid = static_cast<size_t>(opt_.max_sessions_per_uid);
  fo.idle_timeout = std::chrono::seconds(opt_.session_idle_timeout_s);
  fo.socket_gid = socket_gid_;
  fds_ = std::make_unique<FdServer>(cache_->sessions(), cache_->publication(), fo);
  fds_->SetRangeBuffers(range_buffers_.get());
  Status s;
  if (!(s = fds_->Start()).ok()) {
    control_->Stop();
    server_->Shutdown();
    unlink(opt_.socket.c_str());
    return Fail(s.message(), 1);
  }
  return 0;
}

}  // namespace tce
