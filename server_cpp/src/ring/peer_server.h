// PeerServer: accepts the ring's server-to-server connections. Each
// connection is authenticated (PeerLink), then serves requests until it
// closes: a backup is received straight into a new buffer of the
// BackupStore, its record CRCs are checked, and only then is it kept; a drop
// lets go of a copy; a held copy is sent back only to a member of its job's
// ring (or, where this server does not know the ring, to the peer that sent
// it); a file this server holds in its own cache is sent, with its record
// CRCs, only to a member of its job's ring as this server was told it; a
// ranged read (a slice of either, at most kMaxRangeLength bytes, checked
// against the file's size) follows the same rule; a complete tag the
// predecessor recorded is kept (checked, bounded) and listed back under
// the same rule as the copies.
//
// Anyone who can reach the port can open connections, so what a connection
// costs before it authenticates is bounded: one handshake deadline, at most
// `max_handshakes` handshakes at once and `max_handshakes_per_source` from
// one address (a new one beyond either pushes out the oldest, so a flood of
// slow connections cannot lock a real peer out for longer than its own
// handshake takes), and at most `max_connections` authenticated links. One
// thread per connection, joined when it ends; a connection that is a lane of
// another (PeerLane) hands its socket over to that link's thread and counts
// against the limit until that link closes.
#pragma once

#include <atomic>
#include <chrono>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "cache/ring_store.h"
#include "common/clock.h"
#include "common/log_limiter.h"
#include "common/mutex.h"
#include "common/single_flight.h"
#include "ring/backup_store.h"
#include "ring/peer_key.h"
#include "ring/transport.h"
#include "tce/v1/tce.pb.h"

namespace tce {

class VersionFollower;  // ring/version_follower.h

struct PeerServerOptions {
  std::string listen;     // host:port to bind (port 0: any)
  std::string advertise;  // the endpoint peers use; empty: the bound address
  PeerKey key;           // the cluster token (required; and this node's certificate)
  int max_connections = 256;            // authenticated links, lanes included
  int max_handshakes = 64;              // connections not yet authenticated
  int max_handshakes_per_source = 8;    // of those, from one remote address
  std::chrono::milliseconds handshake_timeout{5000};
  std::chrono::milliseconds io_timeout{30000};
  Clock* clock = Clock::Real();  // what the waits for lanes and descriptors are measured on
};

class PeerServer {
 public:
  // `stores` (may be all null: a backup holder only): this node's cache,
  // told when a peer asks for its backups again, and serving peers' reads.
  PeerServer(PeerServerOptions options, Transport* transport, BackupStore* store,
             RingStores stores = RingStores());
  ~PeerServer();
  Status Start();
  void Stop();
  // Where peers reach this server (valid after Start).
  const std::string& endpoint() const { return endpoint_; }
  // The follower whose transfers in flight serve following nodes'
  // ranged reads (pipelined; set before they come, may stay null).
  void SetFollower(VersionFollower* follower) { follower_.store(follower); }
  // The most paths one PeerDurable may ask about (a bounded answer).
  static constexpr int kMaxDurablePaths = 10000;

 private:
  void AcceptLoop();
  // Registers an accepted socket and starts its thread (or refuses it).
  void Admit(int fd, const std::string& source);
  void Serve(int fd, uint64_t worker);
  // Serves requests until the link closes (or becomes a lane: *link is then null).
  void ServeLink(std::unique_ptr<PeerLink>* link);
  // Joins the threads of connections that ended.
  void ReapWorkers();
  // Whether `peer`, acting for `job` as uid `uid` (`named` false: it named
  // none), may read the copy of a file of `job` that `owner` sent as the
  // job of `held_uid` (null: this server's own files of the job; then
  // `owner` is empty). PERMISSION_DENIED, saying why, if not.
  Status MayRead(const std::string& job, const std::string& peer, const std::string& owner, bool named,
                 uint32_t uid, const uid_t* held_uid);
  // A lane waits here, by key, for the link it serves to claim it.
  Status ParkLane(std::unique_ptr<PeerLink>* lane, const v1::PeerLane& req);
  // Binds the parked lanes with the key to `link` (waiting for late ones).
  Status BindLanes(PeerLink* link, const v1::PeerLanes& req);
  Status ServeBackup(PeerLink* link, const v1::PeerBackup& req);
  // Keeps a complete tag the peer recorded, once checked.
  Status HoldTag(PeerLink* link, const v1::PeerTag& req);
  // A held copy, else (for a member of the job's ring) this server's own
  // file in memory. Sends the reply itself (header and bytes follow an OK).
  // Reads (job, path) from storage into the cache for `link`'s peer (a
  // PeerFetch with `load`), telling it every third of the I/O timeout that
  // the answer is coming.
  Status LoadForPeer(PeerLink* link, const std::string& job, const std::string& path);
  Status ServeFetch(PeerLink* link, const v1::PeerFetch& req);
  // A claiming asker's `down` (PeerFetch): the claims of those nodes of the
  // job's ring (not this one) are dropped, so their files are read again.
  void DropClaimsOfDown(const v1::PeerFetch& req, const std::string& asker);
  // Bytes of a held copy, else (for a member of the job's ring) of this
  // server's own file in memory, with their CRC-32; the reply says why not.
  // A raw read gets the reply, then the bytes with sendfile. Returns the
  // link's status (not the read's: a refusal keeps the link).
  Status ServeReadRange(PeerLink* link, const v1::PeerReadRange& req);
  // A following node's ask for the job's newest published version (held
  // up to kMaxVersionWaitMs for one); answers with a PeerVersionReply.
  Status ServeVersion(PeerLink* link, const v1::PeerVersion& req);
  static constexpr uint32_t kMaxVersionWaitMs = 20000;  // well within a link's io timeout
  // Fills in the digests of `tag`'s files (PeerVersions::VersionDigests):
  // computes those of this node's own files once, one computation of a
  // version at a time however many following nodes ask.
  void DigestVersion(TagInfo* tag);
  // A ring member's question: which of these files of the job this server
  // has persisted (ring/tag_barrier.h); answers with a PeerDurableReply.
  Status ServeDurable(PeerLink* link, const v1::PeerDurable& req);

  const PeerServerOptions options_;
  Transport* const transport_;
  BackupStore* const store_;
  RingStore* const cache_;
  RingMembers* const members_;  // the job's ring and uid: who may hand over or read
  RingBackups* const backups_;  // told when a peer lost our copies
  RecoveryStore* const recovery_;
  StorageLoads* const loads_;  // the cooperative restore's reads of storage
  PeerVersions* const versions_;
  NodeGrants* const grants_;
  std::atomic<VersionFollower*> follower_{nullptr};
  SingleFlight<std::pair<std::string, std::string>> digests_;  // by (job, tag)
  std::string endpoint_;
  int listen_fd_ = -1;
  std::thread acceptor_;
  Mutex mu_;
  std::set<int> conns_ GUARDED_BY(mu_);  // authenticated connection fds
  struct Handshake {
    std::string source;  // remote address, without the port
    uint64_t seq = 0;    // arrival order: the oldest is pushed out first
    bool evicted = false;
  };
  std::map<int, Handshake> handshakes_ GUARDED_BY(mu_);  // by fd, until authenticated
  uint64_t next_seq_ GUARDED_BY(mu_) = 0;
  std::map<uint64_t, std::thread> workers_ GUARDED_BY(mu_);
  std::vector<uint64_t> finished_ GUARDED_BY(mu_);  // workers to join
  struct Parked {
    Clock::TimePoint since;
    std::map<int, std::unique_ptr<PeerLink>> lanes;  // by index
  };
  std::map<std::string, Parked> parked_ GUARDED_BY(mu_);  // lanes by key
  CondVar lanes_cv_;
  // What a flood may repeat: a few lines a second, then a count.
  LogLimiter accept_errors_{5, std::chrono::seconds(1)}, refusals_{5, std::chrono::seconds(1)},
      failed_handshakes_{5, std::chrono::seconds(1)};
  std::atomic<bool> stop_{false};
};

}  // namespace tce
