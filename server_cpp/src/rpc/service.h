// CacheService: the gRPC face of the Cache (tce.v1.Cache). Thin: protobuf in,
// Cache call (a load through the ring's RingFetch when there is a ring),
// protobuf out; a Status becomes a grpc::Status with the same code and
// message. Called concurrently by gRPC's worker threads.
//
// Security: every RPC names a session; the Cache decides with that session's
// uid (an unknown session is UNAUTHENTICATED). A blocked Wait holds a gRPC
// thread: at most max_waits run at once, more are RESOURCE_EXHAUSTED. So does
// a call that waits on a ring peer (a ranged read or a fetch from a peer, a
// wait for a restore): at most max_peer_calls at once, max_peer_calls_per_uid
// of them for one uid, more are RESOURCE_EXHAUSTED at once; each ends by the
// caller's deadline or the peer timeouts.
#pragma once

#include <atomic>
#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <utility>

#include "cache/client_store.h"
#include "common/clock.h"
#include "common/call_limiter.h"
#include "meta/meta_writer.h"
#include "rpc/range_buffers.h"
#include "ring/backup_store.h"
#include "ring/range_reader.h"
#include "ring/replicator.h"
#include "ring/ring_fetch.h"
#include "ring/version_follower.h"
#include "tce/v1/tce.grpc.pb.h"

namespace tce {

class CacheService final : public v1::Cache::Service {
 public:

  // `meta` (may be null): the metadata writer whose health Status reports.
  // `clock`: what the calls' deadlines and the uptime are measured on.
  CacheService(ClientStores stores, std::string socket_path, MetaWriter* meta = nullptr,
               std::string metadata_url = "", BackupStore* backups = nullptr,
               std::string peer_endpoint = "", Clock* clock = Clock::Real());

  grpc::Status Allocate(grpc::ServerContext*, const v1::AllocateRequest*, v1::AllocateResponse*) override;
  grpc::Status Commit(grpc::ServerContext*, const v1::CommitRequest*, v1::CommitResponse*) override;
  grpc::Status Abort(grpc::ServerContext*, const v1::AbortRequest*, v1::AbortResponse*) override;
  grpc::Status Lookup(grpc::ServerContext*, const v1::LookupRequest*, v1::LookupResponse*) override;
  grpc::Status Release(grpc::ServerContext*, const v1::ReleaseRequest*, v1::ReleaseResponse*) override;
  grpc::Status Remove(grpc::ServerContext*, const v1::RemoveRequest*, v1::RemoveResponse*) override;
  grpc::Status List(grpc::ServerContext*, const v1::ListRequest*, v1::ListResponse*) override;
  grpc::Status Status(grpc::ServerContext*, const v1::StatusRequest*, v1::StatusResponse*) override;
  grpc::Status Wait(grpc::ServerContext*, const v1::WaitRequest*, v1::WaitResponse*) override;
  grpc::Status CommitTag(grpc::ServerContext*, const v1::CommitTagRequest*, v1::CommitTagResponse*) override;
  grpc::Status ListTags(grpc::ServerContext*, const v1::ListTagsRequest*, v1::ListTagsResponse*) override;
  // A ring set on a node that holds none of the job's files prefetches the
  // job's newest complete tag known here (the prefetcher's share of it).
  grpc::Status SetRing(grpc::ServerContext*, const v1::SetRingRequest*, v1::SetRingResponse*) override;
  grpc::Status Prefetch(grpc::ServerContext*, const v1::PrefetchRequest*, v1::PrefetchResponse*) override;
  grpc::Status Retry(grpc::ServerContext*, const v1::RetryRequest*, v1::RetryResponse*) override;
  grpc::Status ReadRange(grpc::ServerContext*, const v1::ReadRangeRequest*, v1::ReadRangeResponse*) override;
  // Published versions (docs/weights.md). A GetVersion that waits counts
  // among the max_waits blocked calls, as Wait does.
  grpc::Status GetVersion(grpc::ServerContext*, const v1::GetVersionRequest*, v1::GetVersionResponse*) override;
  grpc::Status AcquireVersion(grpc::ServerContext*, const v1::AcquireVersionRequest*,
                              v1::AcquireVersionResponse*) override;
  grpc::Status RenewVersion(grpc::ServerContext*, const v1::RenewVersionRequest*,
                            v1::RenewVersionResponse*) override;
  grpc::Status ReleaseVersion(grpc::ServerContext*, const v1::ReleaseVersionRequest*,
                              v1::ReleaseVersionResponse*) override;
  grpc::Status GrantRead(grpc::ServerContext*, const v1::GrantReadRequest*, v1::GrantReadResponse*) override;
  // Follow (and AcquireVersion of a followed job's files) need the node's
  // follower (set before serving; without it Follow is FAILED_PRECONDITION).
  grpc::Status Follow(grpc::ServerContext*, const v1::FollowRequest*, v1::FollowResponse*) override;
  void SetFollower(VersionFollower* follower) { follower_ = follower; }

  // The ring's part (set before serving): a load that misses asks the ring
  // through `fetch` (ring/ring_fetch.h); `transport` is shown in Status;
  // `prefetch` queues cooperative prefetches (Prefetch, and SetRing).
  void SetRing(RingFetch* fetch, std::string transport, Replicator* prefetch = nullptr) {
    ring_fetch_ = fetch;
    ring_transport_ = std::move(transport);
    prefetch_ = prefetch;
  }
  // Where ranged reads come from (set before serving; without it ReadRange
  // is UNIMPLEMENTED).
  void SetRangeReader(RangeReader* ranges) { ranges_ = ranges; }
  // The sessions' range buffers (set before serving; without it ReadRange
  // with into_buffer is UNIMPLEMENTED).
  void SetRangeBuffers(RangeBuffers* buffers) { range_buffers_ = buffers; }
  // The whole server's status, unfiltered: for the daemon's own metrics.
  // `loads_admin` / `loads_uid`: whose jobs' load splits and followed jobs
  // it shows (every job's for an administrator, else that uid's).
  void FillStatus(v1::StatusResponse* resp, bool loads_admin = true, uid_t loads_uid = 0);
  // At most `n` calls that block until something happens (Wait, a
  // GetVersion that waits) at once, `per_uid` of them for one uid (set
  // before serving).
  void SetMaxWaits(size_t n, size_t per_uid) {
    waits_ = std::make_unique<CallLimiter>(n, per_uid, "max_waits", "max_waits_per_uid", "blocked calls");
  }
  // At most `n` calls that wait on a peer at once, `per_uid` of them for
  // one uid (set before serving).
  void SetMaxPeerCalls(size_t n, size_t per_uid) {
    peer_calls_ = std::make_unique<CallLimiter>(n, per_uid, "max_peer_calls", "max_peer_calls_per_uid");
  }
  // Where the operational endpoints listen (set before serving), for Status.
  void SetEndpoints(std::string metrics, std::string health) {
    metrics_endpoint_ = std::move(metrics);
    health_endpoint_ = std::move(health);
  }

 private:
  ClientStore* const cache_;  // files
  SessionStore* const sessions_;
  StoredFiles* const stored_;
  VersionStore* const versions_;
  RestoreTracker* const restores_;
  ClientRings* const rings_;  // SetRing, ranged reads' check
  const std::string socket_path_;
  MetaWriter* const meta_;
  const std::string metadata_url_;
  BackupStore* const backups_;
  const std::string peer_endpoint_;
  RingFetch* ring_fetch_ = nullptr;
  Replicator* prefetch_ = nullptr;  // queues cooperative prefetches (none: Prefetch queues nothing)
  RangeReader* ranges_ = nullptr;
  RangeBuffers* range_buffers_ = nullptr;
  VersionFollower* follower_ = nullptr;
  std::string ring_transport_;
  std::string metrics_endpoint_, health_endpoint_;
  // A refusal of `session` (or its uid's place in *slot): may its call wait
  // on a peer now?
  tce::Status AdmitPeerCall(const std::string& session, CallLimiter::Slot* slot);
  // A refusal of `session` (or its uid's place in *slot among the blocked
  // calls, which it gives back when it goes).
  tce::Status AdmitWait(const std::string& session, CallLimiter::Slot* slot);

  std::unique_ptr<CallLimiter> waits_ =
      std::make_unique<CallLimiter>(256, 64, "max_waits", "max_waits_per_uid", "blocked calls");
  std::unique_ptr<CallLimiter> peer_calls_;  // none: every such call runs
  Clock* const clock_;
  const Clock::TimePoint started_;
};

// Protobuf <-> internal conversions (exposed for tests).
void ToProto(const FileInfo& f, v1::FileInfo* out);
void ToProto(const TagInfo& t, v1::TagInfo* out);
grpc::Status ToGrpc(const tce::Status& s);

}  // namespace tce
