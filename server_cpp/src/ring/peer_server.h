// PeerServer: accepts the ring's server-to-server connections. Each
// connection is authenticated (PeerLink), then serves requests until it
// closes: a backup is received straight into a new buffer of the
// BackupStore, its record CRCs are checked, and only then is it kept; a drop
// lets go of a copy. A bad or unauthenticated peer costs only its own
// connection. One thread per connection, at most `max_connections`; a
// connection that is a lane of another (PeerLane) hands its socket over to
// that link's thread and counts against the limit until that link closes.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "cache/cache.h"
#include "ring/backup_store.h"
#include "ring/transport.h"
#include "tce/v1/tce.pb.h"

namespace tce {

struct PeerServerOptions {
  std::string listen;     // host:port to bind (port 0: any)
  std::string advertise;  // the endpoint peers use; empty: the bound address
  std::string token;      // the cluster token (required)
  int max_connections = 256;
  std::chrono::milliseconds io_timeout{30000};
};

class PeerServer {
 public:
  // `cache` (may be null): told when a peer asks for its backups again.
  PeerServer(PeerServerOptions options, Transport* transport, BackupStore* store,
             Cache* cache = nullptr);
  ~PeerServer();
  Status Start();
  void Stop();
  // Where peers reach this server (valid after Start).
  const std::string& endpoint() const { return endpoint_; }

 private:
  void AcceptLoop();
  void Serve(int fd);
  // A lane waits here, by key, for the link it serves to claim it.
  Status ParkLane(std::unique_ptr<PeerLink>* lane, const v1::PeerLane& req);
  // Binds the parked lanes with the key to `link` (waiting for late ones).
  Status BindLanes(PeerLink* link, const v1::PeerLanes& req);
  Status ServeBackup(PeerLink* link, const v1::PeerBackup& req);
  // Sends the reply itself (header and bytes follow an OK).
  Status ServeFetch(PeerLink* link, const v1::PeerFetch& req);

  const PeerServerOptions options_;
  Transport* const transport_;
  BackupStore* const store_;
  Cache* const cache_;
  std::string endpoint_;
  int listen_fd_ = -1;
  std::thread acceptor_;
  std::mutex mu_;
  std::set<int> conns_;                // GUARDED_BY(mu_): open connection fds
  std::vector<std::thread> workers_;   // GUARDED_BY(mu_)
  struct Parked {
    std::chrono::steady_clock::time_point since;
    std::map<int, std::unique_ptr<PeerLink>> lanes;  // by index
  };
  std::map<std::string, Parked> parked_;  // GUARDED_BY(mu_): lanes by key
  std::condition_variable lanes_cv_;
  std::atomic<bool> stop_{false};
};

}  // namespace tce
