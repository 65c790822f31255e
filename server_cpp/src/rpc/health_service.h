// The gRPC health service (grpc.health.v1.Health) over the server's own
// serving states. One HealthStates is shared by every server that exposes it
// (the TCP port the probes use, and the Unix socket).
//
// Names served: "" and "tce.v1.Cache" (readiness: serving until a shutdown
// drain begins) and "liveness" (serving while the process runs). Check of an
// unknown name is NOT_FOUND; Watch streams each change until the client
// leaves or the server stops. A Watch holds a server thread, and the health
// port takes unauthenticated calls: at most kMaxWatches stream at once per
// service, more are RESOURCE_EXHAUSTED at once (Check always answers).
#pragma once

#include <grpcpp/grpcpp.h>

#include <atomic>
#include <map>
#include <string>

#include "common/mutex.h"
#include "grpc/health/v1/health.grpc.pb.h"

namespace tce {

class HealthStates {
 public:
  void Set(const std::string& service, bool serving);
  // False when `service` is unknown.
  bool Get(const std::string& service, bool* serving) const;
  // Waits until the state of `service` differs from `seen` (or `until`
  // passes, or Shutdown); returns the state now (-1: unknown).
  int WaitChange(const std::string& service, int seen, std::chrono::milliseconds until);
  void Shutdown();  // ends every Watch
  bool shut_down() const;

 private:
  mutable Mutex mu_;
  CondVar cv_;
  std::map<std::string, bool> serving_ GUARDED_BY(mu_);
  bool shutdown_ GUARDED_BY(mu_) = false;
};

class HealthService final : public grpc::health::v1::Health::Service {
 public:
  explicit HealthService(HealthStates* states) : states_(states) {}
  static constexpr int kMaxWatches = 8;

  grpc::Status Check(grpc::ServerContext*, const grpc::health::v1::HealthCheckRequest*,
                     grpc::health::v1::HealthCheckResponse*) override;
  grpc::Status Watch(grpc::ServerContext*, const grpc::health::v1::HealthCheckRequest*,
                     grpc::ServerWriter<grpc::health::v1::HealthCheckResponse>*) override;

 private:
  HealthStates* const states_;
  std::atomic<int> watches_{0};
};

}  // namespace tce
