#include "rpc/health_service.h"

#include "common/clock.h"

namespace tce {

using grpc::health::v1::HealthCheckRequest;
using grpc::health::v1::HealthCheckResponse;

void HealthStates::Set(const std::string& service, bool serving) {
  {
    MutexLock l(&mu_);
    serving_[service] = serving;
  }
  cv_.SignalAll();
}

bool HealthStates::Get(const std::string& service, bool* serving) const {
  MutexLock l(&mu_);
  auto it = serving_.find(service);
  if (it == serving_.end()) return false;
  *serving = it->second;
  return true;
}

int HealthStates::WaitChange(const std::string& service, int seen, std::chrono::milliseconds until) {
  Clock* const clock = Clock::Real();  // the watch stream's real pacing
  const auto deadline = clock->Now() + until;
  MutexLock l(&mu_);
  auto now = [&]() REQUIRES(mu_) {
    auto it = serving_.find(service);
    return it == serving_.end() ? -1 : static_cast<int>(it->second);
  };
  while (!shutdown_ && now() == seen && clock->WaitUntil(&cv_, &mu_, deadline)) {
  }
  return now();
}

void HealthStates::Shutdown() {
  {
    MutexLock l(&mu_);
    shutdown_ = true;
  }
  cv_.SignalAll();
}

bool HealthStates::shut_down() const {
  MutexLock l(&mu_);
  return shutdown_;
}

namespace {

HealthCheckResponse::ServingStatus ToStatus(int state) {
  return state < 0 ? HealthCheckResponse::SERVICE_UNKNOWN
                   : state ? HealthCheckResponse::SERVING : HealthCheckResponse::NOT_SERVING;
}

}  // namespace

grpc::Status HealthService::Check(grpc::ServerContext*, const HealthCheckRequest* req,
                                  HealthCheckResponse* resp) {
  bool serving = false;
  if (!states_->Get(req->service(), &serving))
    return grpc::Status(grpc::StatusCode::NOT_FOUND, "unknown service: " + req->service());
  resp->set_status(serving ? HealthCheckResponse::SERVING : HealthCheckResponse::NOT_SERVING);
  return grpc::Status::OK;
}

grpc::Status HealthService::Watch(grpc::ServerContext* ctx, const HealthCheckRequest* req,
                                  grpc::ServerWriter<HealthCheckResponse>* writer) {
  if (watches_.fetch_add(1) >= kMaxWatches) {
    --watches_;
    return grpc::Status(grpc::StatusCode::RESOURCE_EXHAUSTED,
                        "too many Watch streams at once (" + std::to_string(kMaxWatches) + "): use Check");
  }
  struct Done {
    std::atomic<int>* n;
    ~Done() { --*n; }
  } done{&watches_};
  bool serving = false;
  int state = states_->Get(req->service(), &serving) ? static_cast<int>(serving) : -1;
  for (;;) {
    HealthCheckResponse resp;
    resp.set_status(ToStatus(state));
    if (!writer->Write(resp)) return grpc::Status::OK;  // the client left
    int next = state;
    while (next == state) {  // wakes at least every second to notice a cancelled call
      if (ctx->IsCancelled() || states_->shut_down())
        return grpc::Status(grpc::StatusCode::CANCELLED, "the server is stopping");
      next = states_->WaitChange(req->service(), state, std::chrono::seconds(1));
    }
    state = next;
  }
}

}  // namespace tce
