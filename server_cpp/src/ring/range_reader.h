// RangeReader: where the bytes of a ranged read (the ReadRange call) come
// from. This server's own file in memory first; else the copy it holds for
// its predecessor, when a member of the job's ring sent it; else a ring
// member that has the file in memory or holds a copy (PeerReadRange over an
// authenticated link), the member that last answered for the file first,
// then the others, the successor first. Only the range moves: a file is
// never pulled whole. A peer's reply is hostile input: its size, and its
// CRC-32 against the bytes, are checked before any byte is handed on.
//
// The caller (rpc/service) checked the asking session's right to the job;
// the range is checked here (CheckRange) against the file's size. Links are
// kept per peer (up to kIdleLinks idle ones) and dropped on any failure.
// Thread-safe: RPC threads call Read concurrently.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "cache/ring_store.h"
#include "common/clock.h"
#include "common/mutex.h"
#include "ring/backup_store.h"
#include "ring/peer_link.h"
#include "tce/v1/tce.pb.h"

namespace tce {

struct RangeReaderOptions {
  std::string self;   // our advertised peer endpoint (empty: no ring, no peers asked)
  PeerKey key;  // the cluster token (and this node's certificate)
  std::chrono::milliseconds io_timeout{30000};
  BackupStore* held = nullptr;  // the copies this server keeps (optional)
  LinkBreaker* breaker = nullptr;  // ends the peer waits when the server stops (optional)
  Clock* clock = Clock::Real();     // what deadlines are measured on
  // Peers found not answering, for a job (the Replicator's RestorePlans;
  // optional): one that is down is not asked; one that says nothing for
  // io_timeout is marked down.
  std::function<bool(const std::string& job, const std::string& peer)> is_down;
  std::function<void(const std::string& job, const std::string& peer)> mark_down;
};

// How one read may wait on the ring's peers: the caller's limits.
struct PeerWait {
  // Asked once, before the first peer is: a failure (the caller may not
  // wait on a peer now) is the read's answer. None: always admitted.
  std::function<Status()> admit;
  // No peer is asked after this, and a new link must be up by then (each
  // send and receive on a link is bounded by io_timeout besides).
  Clock::TimePoint deadline = Clock::TimePoint::max();
};

struct RangeRead {
  std::string data;  // the asked bytes (unless they went where the caller said)
  v1::RangeSource source = v1::RANGE_SOURCE_UNSPECIFIED;
  uint64_t file_size = 0;
};

class RangeReader {
 public:
  static constexpr size_t kIdleLinks = 4;  // kept per peer

  // `stores.members` (the job's peers and uid) and `stores.recovery`
  // (this node's files in memory).
  RangeReader(RingStores stores, RangeReaderOptions options);
  // Bytes [offset, offset + length) of (job, path). NOT_FOUND when neither
  // this server nor any reachable ring member has the file (the message says
  // which member failed, if one did); OUT_OF_RANGE or
  // INVALID_ARGUMENT for a range the file does not have; DATA_LOSS when a
  // peer's bytes do not match their CRC (the next member is asked first).
  // With `into` (room for `length` bytes), the bytes go there and out->data
  // stays empty; on failure `into` may hold some of them. `wait` bounds
  // the asking of peers (admit's refusal, or DEADLINE_EXCEEDED once its
  // deadline passed between peers).
  Status Read(const std::string& job, const std::string& path, uint64_t offset, uint64_t length,
              RangeRead* out, unsigned char* into = nullptr, const PeerWait& wait = {})
      EXCLUDES(mu_);

  // For a node following a job's published versions (ring/version_follower.h):
  // bytes [offset, offset + length) of (job, path) of the version recorded
  // as `tag`, from `peer` alone, asked as this node (PeerReadRange's
  // version_tag), into `to`; the reply checked as any peer's (size, CRC-32).
  Status ReadVersionFile(const std::string& peer, const std::string& job, const std::string& tag,
                         const std::string& path, uint64_t offset, uint64_t length, unsigned char* to,
                         uint64_t* file_size, Clock::TimePoint deadline) EXCLUDES(mu_);

  uint64_t local_reads() const { return local_reads_.load(); }
  uint64_t held_reads() const { return held_reads_.load(); }
  uint64_t peer_reads() const { return peer_reads_.load(); }
  uint64_t peer_bytes() const { return peer_bytes_.load(); }

 private:
  // Each reads into `to` (room for `length` bytes).
  Status ReadInto(const std::string& job, const std::string& path, uint64_t offset, uint64_t length,
                  RangeRead* out, unsigned char* to, const PeerWait& wait) EXCLUDES(mu_);
  Status ReadOwn(const std::string& job, const std::string& path, uint64_t offset, uint64_t length,
                 RangeRead* out, unsigned char* to);
  Status ReadHeld(const std::string& job, const std::string& path, uint64_t offset, uint64_t length,
                  RangeRead* out, unsigned char* to);
  // One PeerReadRange to `peer`, its reply checked; with `tag`, a
  // following node's read of that version's file. No wait lasts past
  // `deadline`; *silent (optional): the peer said nothing for io_timeout.
  Status ReadPeer(const std::string& peer, const std::string& job, const std::string& path,
                  uint64_t offset, uint64_t length, RangeRead* out, unsigned char* to,
                  Clock::TimePoint deadline, const std::string& tag = "", bool* silent = nullptr) EXCLUDES(mu_);
  // The handshake's bound: io_timeout, or less to end by `deadline`.
  std::chrono::milliseconds ConnectTimeout(Clock::TimePoint deadline) const;
  std::unique_ptr<PeerLink> TakeLink(const std::string& peer) EXCLUDES(mu_);
  void ReturnLink(const std::string& peer, std::unique_ptr<PeerLink> link) EXCLUDES(mu_);

  RingMembers* const members_;  // the job's peers and uid
  RecoveryStore* const recovery_;  // reads of this node's own files
  const RangeReaderOptions options_;
  std::atomic<uint64_t> local_reads_{0}, held_reads_{0}, peer_reads_{0}, peer_bytes_{0};
  Mutex mu_;
  std::map<std::string, std::vector<std::unique_ptr<PeerLink>>> idle_ GUARDED_BY(mu_);
  // (job, path) -> the member that answered last; bounded (cleared past 4096).
  std::map<std::pair<std::string, std::string>, std::string> holder_ GUARDED_BY(mu_);
};

}  // namespace tce
