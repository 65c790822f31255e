// CacheService: the calls of tce.v1.Cache, protobuf in and out (rpc/service.h).
// What the server reports of itself (Status): service_status.cc.
#include "rpc/service.h"

#include <algorithm>

#include "cache/file_state_proto.h"
#include "cache/record_proto.h"
#include "cache/tag_proto.h"
#include "common/logging.h"
#include "rpc/request_checks.h"

namespace tce {
namespace {

// When a call that may wait must answer: half a second before the client's
// deadline (so the client reads the server's reason, not its own timeout);
// none when the client set none.
Clock::TimePoint AnswerBy(const grpc::ServerContext* ctx, Clock* clock) {
  const auto deadline = ctx->deadline();
  if (deadline == Clock::WallTime::max()) return Clock::TimePoint::max();
  const auto left = deadline - clock->WallNow() - std::chrono::milliseconds(500);
  return clock->Now() + std::chrono::duration_cast<Clock::Duration>(left);
}

}  // namespace

grpc::Status ToGrpc(const tce::Status& s) {
  if (s.ok()) return grpc::Status::OK;
  return grpc::Status(static_cast<grpc::StatusCode>(static_cast<int>(s.code())), s.message());
}

void ToProto(const FileInfo& f, v1::FileInfo* out) {
  out->set_job(f.job);
  out->set_tag(f.tag);
  out->set_rank(f.rank);
  out->set_path(f.path);
  out->set_size(f.size);
  out->set_state(FileStateToProto(f.state));
  out->set_buffer_id(f.buffer_id);
  out->set_capacity(f.capacity);
  out->set_created_unix_ns(f.created_unix_ns);
  out->set_committed_unix_ns(f.committed_unix_ns);
  out->set_persisted_unix_ns(f.persisted_unix_ns);
  out->set_reason(f.reason);
  out->set_backup_holder(f.backup_holder);
  out->set_version(f.version);
  RecordsToProto(f.records, out->mutable_records());
}

void ToProto(const TagInfo& t, v1::TagInfo* out) { TagToProto(t, out); }

CacheService::CacheService(ClientStores stores, std::string socket_path, MetaWriter* meta,
                           std::string metadata_url, BackupStore* backups, std::string peer_endpoint,
                           Clock* clock)
    : cache_(stores.files),
      sessions_(stores.sessions),
      stored_(stores.stored),
      versions_(stores.versions),
      restores_(stores.restores),
      rings_(stores.rings),
      socket_path_(std::move(socket_path)), meta_(meta),
      metadata_url_(std::move(metadata_url)), backups_(backups),
      peer_endpoint_(std::move(peer_endpoint)), clock_(clock), started_(clock->Now()) {}

grpc::Status CacheService::Allocate(grpc::ServerContext*, const v1::AllocateRequest* req,
                                    v1::AllocateResponse* resp) {
  if (tce::Status bad = CheckRequest(*req); !bad.ok()) return ToGrpc(bad);
  AllocateRequest r{req->session(), req->job(), req->tag(), req->path(), req->rank(), req->size(),
                    req->has_mode() ? req->mode() & 0777 : 0644};
  AllocateResult out;
  tce::Status s = cache_->Allocate(r, &out);
  if (!s.ok()) return ToGrpc(s);
  resp->set_allocation_id(out.allocation_id);
  resp->set_buffer_id(out.buffer_id);
  resp->set_capacity(out.capacity);
  for (uint64_t id : out.unmap_buffer_ids) resp->add_unmap_buffer_ids(id);
  return grpc::Status::OK;
}

grpc::Status CacheService::Commit(grpc::ServerContext*, const v1::CommitRequest* req,
                                  v1::CommitResponse* resp) {
  if (tce::Status bad = CheckRequest(*req); !bad.ok()) return ToGrpc(bad);
  std::vector<Record> records = RecordsFromProto(req->records(), /*keep_crc=*/false);  // the server fills CRCs
  FileInfo f;
  tce::Status s = cache_->Commit(req->session(), req->allocation_id(), std::move(records), &f,
                                 /*zip_crc32=*/!req->omit_zip_crc32());
  if (s.ok()) ToProto(f, resp->mutable_file());
  return ToGrpc(s);
}

grpc::Status CacheService::Abort(grpc::ServerContext*, const v1::AbortRequest* req,
                                 v1::AbortResponse*) {
  if (tce::Status bad = CheckRequest(*req); !bad.ok()) return ToGrpc(bad);
  return ToGrpc(cache_->Abort(req->session(), req->allocation_id()));
}

tce::Status CacheService::AdmitPeerCall(const std::string& session, CallLimiter::Slot* slot) {
  bool admin = false;
  uid_t uid = 0;
  tce::Status s = sessions_->CheckCaller(session, &admin, &uid);
  if (!s.ok() || !peer_calls_) return s;
  return peer_calls_->Enter(uid, slot);
}

grpc::Status CacheService::Lookup(grpc::ServerContext* ctx, const v1::LookupRequest* req,
                                  v1::LookupResponse* resp) {
  if (tce::Status bad = CheckRequest(*req); !bad.ok()) return ToGrpc(bad);
  FileInfo f;
  uint64_t lease = 0;
  std::vector<uint64_t> unmap;
  CallLimiter::Slot slot;  // held while the lookup waits on the ring
  LoadFrom from = LoadFrom::kCache;
  tce::Status s =
      ring_fetch_ ? ring_fetch_->Lookup(req->session(), req->job(), req->path(), req->lease(), &f,
                                        &lease, &unmap, AnswerBy(ctx, clock_), !req->local_only(),
                                        [&] { return AdmitPeerCall(req->session(), &slot); }, &from)
                  : cache_->Lookup(req->session(), req->job(), req->path(), req->lease(), &f,
                                   &lease, &unmap);
  if (s.code() == tce::Status::Code::kNotFound && req->lease() && !req->local_only() &&
      stored_->FetchesOnMiss(req->path())) {
    // Not in memory, nor in the ring: read from storage into the cache, once
    // for all the ranks of this node that load it. A directory root's file
    // this server cannot read, the client still can try to (with its own
    // rights); an object root's, it cannot.
    tce::Status admitted = slot.held() ? tce::Status::OK() : AdmitPeerCall(req->session(), &slot);
    tce::Status fetched =
        admitted.ok() ? stored_->FetchFromStorage(req->session(), req->job(), req->path()) : admitted;
    if (fetched.ok() || fetched.code() == tce::Status::Code::kFailedPrecondition) {
      unmap.clear();
      if (fetched.ok()) from = LoadFrom::kStorage;
      s = cache_->Lookup(req->session(), req->job(), req->path(), req->lease(), &f, &lease, &unmap);
    } else if (fetched.code() != tce::Status::Code::kNotFound && stored_->IsObjectPath(req->path())) {
      s = fetched;
    } else if (fetched.code() != tce::Status::Code::kNotFound) {
      TCE_LOG(kInfo, "cache") << "load of " << req->path() << " left to the client: " << fetched.ToString();
    }
  }
  for (uint64_t id : unmap) resp->add_unmap_buffer_ids(id);
  if (!s.ok()) return ToGrpc(s);
  ToProto(f, resp->mutable_file());
  resp->set_lease_id(lease);
  if (req->lease()) {  // a load: where its bytes came from
    resp->set_source(from == LoadFrom::kCache     ? v1::LOAD_SOURCE_CACHE
                     : from == LoadFrom::kPeer    ? v1::LOAD_SOURCE_PEER
                                                  : v1::LOAD_SOURCE_STORAGE);
    if (from == LoadFrom::kCache) stored_->NoteLoad(req->job(), LoadFrom::kCache, f.size);
  }
  return grpc::Status::OK;
}

grpc::Status CacheService::ReadRange(grpc::ServerContext* ctx, const v1::ReadRangeRequest* req,
                                     v1::ReadRangeResponse* resp) {
  if (tce::Status bad = CheckRequest(*req); !bad.ok()) return ToGrpc(bad);
  const bool object = stored_->IsObjectPath(req->path());
  if (!ranges_ && !object) return ToGrpc(tce::Status::NotSupported("this server reads no ranges"));
  tce::Status s = rings_->CheckRangeRead(req->session(), req->job());
  RangeRead r;
  std::shared_ptr<RangeBuffers::Held> hold;  // the session's buffer, while we write into it
  unsigned char* into = nullptr;
  if (s.ok() && req->into_buffer())
    s = range_buffers_ ? range_buffers_->Place(req->session(), req->buffer_offset(), req->length(), &hold, &into)
                       : tce::Status::NotSupported("this server has no range buffers");
  CallLimiter::Slot slot;  // held while peers are asked
  PeerWait wait;
  wait.admit = [&] { return AdmitPeerCall(req->session(), &slot); };
  wait.deadline = AnswerBy(ctx, clock_);
  if (s.ok()) {
    s = ranges_ ? ranges_->Read(req->job(), req->path(), req->offset(), req->length(), &r, into, wait)
                : tce::Status::NotFound(req->path() + " is not in memory here");
  }
  if (s.code() == tce::Status::Code::kNotFound && ranges_ && ring_fetch_) {
    // In no node's memory: the restore plan's node reads the whole file
    // from storage once, and every reader's ranges come from its memory.
    tce::Status admitted = slot.held() ? tce::Status::OK() : AdmitPeerCall(req->session(), &slot);
    tce::Status staged = admitted.ok() ? ring_fetch_->StageForRanges(req->job(), req->path(), wait.deadline) : admitted;
    if (staged.ok() || staged.code() == tce::Status::Code::kFailedPrecondition)
      s = ranges_->Read(req->job(), req->path(), req->offset(), req->length(), &r, into, wait);
    else if (staged.code() == tce::Status::Code::kDeadlineExceeded)  // a peer held it up: the caller hears why
      s = staged;
  }
  ObjectId object_id;  // read from the bucket: the object's identity
  if (s.code() == tce::Status::Code::kNotFound && object) {
    // Neither here nor in the ring: the range from the bucket (only the
    // range moves, as from a peer); with the identity the load pinned, no
    // look at the object first.
    tce::Status admitted = slot.held() ? tce::Status::OK() : AdmitPeerCall(req->session(), &slot);
    object_id.etag = req->expect_etag();
    object_id.size = req->expect_size();
    s = admitted.ok() ? stored_->ReadObjectRange(req->session(), req->job(), req->path(), req->offset(),
                                                req->length(), &r.data, into, &object_id)
                      : admitted;
    r.source = v1::RANGE_SOURCE_STORAGE;
    r.file_size = object_id.size;
  }
  if (!s.ok()) return ToGrpc(s);
  *resp->mutable_data() = std::move(r.data);
  resp->set_source(r.source);
  resp->set_file_size(r.file_size);
  resp->set_etag(object_id.etag);
  return grpc::Status::OK;
}

grpc::Status CacheService::Release(grpc::ServerContext*, const v1::ReleaseRequest* req,
                                   v1::ReleaseResponse*) {
  if (tce::Status bad = CheckRequest(*req); !bad.ok()) return ToGrpc(bad);
  std::vector<uint64_t> leases(req->lease_ids().begin(), req->lease_ids().end());
  std::vector<uint64_t> unmapped(req->unmapped_buffer_ids().begin(),
                                 req->unmapped_buffer_ids().end());
  return ToGrpc(cache_->Release(req->session(), leases, unmapped));
}

grpc::Status CacheService::Remove(grpc::ServerContext*, const v1::RemoveRequest* req,
                                  v1::RemoveResponse* resp) {
  if (tce::Status bad = CheckRequest(*req); !bad.ok()) return ToGrpc(bad);
  FileInfo f;
  tce::Status s = cache_->Remove(req->session(), req->job(), req->path(), &f);
  if (s.ok()) ToProto(f, resp->mutable_file());
  if (req->from_storage() && stored_->IsObjectPath(req->path()) &&
      (s.ok() || s.code() == tce::Status::Code::kNotFound)) {
    CallLimiter::Slot slot;  // a network call, bounded like the other waits on others
    s = AdmitPeerCall(req->session(), &slot);
    if (s.ok()) s = stored_->DeleteObject(req->session(), req->job(), req->path());
  }
  return ToGrpc(s);
}

grpc::Status CacheService::List(grpc::ServerContext* ctx, const v1::ListRequest* req,
                                v1::ListResponse* resp) {
  if (tce::Status bad = CheckRequest(*req); !bad.ok()) return ToGrpc(bad);
  if (req->wait_for_restore() && !req->job().empty()) {
    bool admin = false;  // only a caller with a session waits
    tce::Status s = sessions_->CheckCaller(req->session(), &admin, /*uid=*/nullptr);
    CallLimiter::Slot slot;  // held while it waits for the ring
    if (s.ok() && restores_->InProgress(req->job())) s = AdmitPeerCall(req->session(), &slot);
    if (s.ok()) s = restores_->WaitFor(req->job(), nullptr, AnswerBy(ctx, clock_));
    if (!s.ok()) return ToGrpc(s);
  }
  std::vector<FileInfo> files;
  tce::Status s = req->storage_dir().empty()
                      ? cache_->List(req->session(), req->job(), req->tag(), &files, req->check_storage())
                      : stored_->ListStored(req->session(), req->job(), req->storage_dir(), &files);
  for (const FileInfo& f : files) ToProto(f, resp->add_files());
  return ToGrpc(s);
}

grpc::Status CacheService::Wait(grpc::ServerContext* ctx, const v1::WaitRequest* req,
                                v1::WaitResponse* resp) {
  int64_t timeout_ms = 0;
  if (tce::Status bad = CheckRequest(*req, &timeout_ms); !bad.ok()) return ToGrpc(bad);
  CallLimiter::Slot slot;
  if (tce::Status busy = AdmitWait(req->session(), &slot); !busy.ok()) return ToGrpc(busy);
  std::vector<std::string> paths(req->paths().begin(), req->paths().end());
  std::vector<FileInfo> files;
  auto timeout = std::chrono::milliseconds(timeout_ms);
  tce::Status s =
      cache_->Wait(req->session(), req->job(), paths, timeout, &files, [ctx] { return ctx->IsCancelled(); });
  for (const FileInfo& f : files) ToProto(f, resp->add_files());
  return ToGrpc(s);
}

grpc::Status CacheService::CommitTag(grpc::ServerContext*, const v1::CommitTagRequest* req,
                                     v1::CommitTagResponse* resp) {
  if (tce::Status bad = CheckRequest(*req); !bad.ok()) return ToGrpc(bad);
  TagInfo t = TagFromProto(req->tag());
  t.complete_unix_ns = 0;  // the server's to set
  TagInfo out;
  tce::Status s = cache_->CommitTag(req->session(), std::move(t), &out);
  if (s.ok()) ToProto(out, resp->mutable_tag());
  return ToGrpc(s);
}

grpc::Status CacheService::ListTags(grpc::ServerContext* ctx, const v1::ListTagsRequest* req,
                                    v1::ListTagsResponse* resp) {
  if (tce::Status bad = CheckRequest(*req); !bad.ok()) return ToGrpc(bad);
  if (req->wait_for_restore()) {  // the tags come back with the files
    bool admin = false;  // only a caller with a session waits
    tce::Status s = sessions_->CheckCaller(req->session(), &admin, /*uid=*/nullptr);
    CallLimiter::Slot slot;  // held while it waits for the ring
    if (s.ok() && restores_->InProgress(req->job())) s = AdmitPeerCall(req->session(), &slot);
    if (s.ok()) s = restores_->WaitFor(req->job(), nullptr, AnswerBy(ctx, clock_));
    if (!s.ok()) return ToGrpc(s);
  }
  std::vector<TagInfo> tags;
  tce::Status s = cache_->ListTags(req->session(), req->job(), &tags);
  for (const TagInfo& t : tags) ToProto(t, resp->add_tags());
  return ToGrpc(s);
}

grpc::Status CacheService::SetRing(grpc::ServerContext*, const v1::SetRingRequest* req,
                                   v1::SetRingResponse* resp) {
  if (tce::Status bad = CheckRequest(*req); !bad.ok()) return ToGrpc(bad);
  if (peer_endpoint_.empty())
    return ToGrpc(tce::Status::FailedPrecondition(
        "this server takes part in no ring: start it with peer_listen and a peer token"));
  std::vector<std::string> endpoints(req->endpoints().begin(), req->endpoints().end());
  std::string successor;
  tce::Status s = rings_->SetRing(req->session(), req->job(), req->node_rank(), std::move(endpoints),
                                  &successor);
  if (s.ok()) resp->set_successor(successor);
  if (s.ok() && prefetch_) {  // a restart: the newest complete tag this node knows of
    std::vector<TagInfo> tags;  // oldest first
    if (cache_->ListTags(req->session(), req->job(), &tags).ok() && !tags.empty()) {
      std::vector<std::string> paths;
      for (const TagFile& f : tags.back().files) paths.push_back(f.path);
      prefetch_->Prefetch(req->job(), "", std::move(paths), /*only_if_empty=*/true);
    }
  }
  return ToGrpc(s);
}

grpc::Status CacheService::Prefetch(grpc::ServerContext*, const v1::PrefetchRequest* req,
                                    v1::PrefetchResponse* resp) {
  if (tce::Status bad = CheckRequest(*req); !bad.ok()) return ToGrpc(bad);
  tce::Status s = rings_->CheckRangeRead(req->session(), req->job());  // the job's own user, its ring joined
  if (!s.ok()) return ToGrpc(s);
  std::vector<std::string> paths(req->paths().begin(), req->paths().end());
  resp->set_queued(prefetch_ && prefetch_->Prefetch(req->job(), req->dir(), std::move(paths), /*only_if_empty=*/false));
  return grpc::Status::OK;
}

grpc::Status CacheService::Retry(grpc::ServerContext*, const v1::RetryRequest* req,
                                 v1::RetryResponse* resp) {
  if (tce::Status bad = CheckRequest(*req); !bad.ok()) return ToGrpc(bad);
  std::vector<std::string> paths(req->paths().begin(), req->paths().end());
  std::vector<FileInfo> files;
  tce::Status s = cache_->RetryFailed(req->session(), req->job(), paths, &files);
  for (const FileInfo& f : files) ToProto(f, resp->add_files());
  return ToGrpc(s);
}

tce::Status CacheService::AdmitWait(const std::string& session, CallLimiter::Slot* slot) {
  bool admin = false;
  uid_t uid = 0;
  tce::Status s = sessions_->CheckCaller(session, &admin, &uid);
  if (!s.ok()) return s;
  return waits_->Enter(uid, slot);
}

grpc::Status CacheService::GetVersion(grpc::ServerContext* ctx, const v1::GetVersionRequest* req,
                                      v1::GetVersionResponse* resp) {
  int64_t wait_ms = 0;
  if (tce::Status bad = CheckRequest(*req, &wait_ms); !bad.ok()) return ToGrpc(bad);
  CallLimiter::Slot slot;
  if (wait_ms > 0) {
    if (tce::Status busy = AdmitWait(req->session(), &slot); !busy.ok()) return ToGrpc(busy);
  }
  TagInfo tag;
  tce::Status s = versions_->GetVersion(req->session(), req->job(), req->after(), std::chrono::milliseconds(wait_ms),
                                     AnswerBy(ctx, clock_), &tag, [ctx] { return ctx->IsCancelled(); });
  if (s.ok()) ToProto(tag, resp->mutable_tag());
  return ToGrpc(s);
}

grpc::Status CacheService::AcquireVersion(grpc::ServerContext* ctx, const v1::AcquireVersionRequest* req,
                                          v1::AcquireVersionResponse* resp) {
  int64_t lease_ms = 0;
  if (tce::Status bad = CheckRequest(*req, &lease_ms); !bad.ok()) return ToGrpc(bad);
  const auto lease = std::chrono::milliseconds(lease_ms);
  VersionGrant g;
  tce::Status s = versions_->AcquireVersion(req->session(), req->job(), req->version(), lease, &g);
  if (!s.ok()) return ToGrpc(s);
  // A followed job: the files asked for that are not here come from the
  // sources first, then the version is leased again with them.
  std::vector<std::string> missing;
  for (const std::string& path : req->paths()) {
    auto f = std::find_if(g.files.begin(), g.files.end(), [&](const FileInfo& x) { return x.path == path; });
    if (f != g.files.end() && f->buffer_id == 0) missing.push_back(path);
  }
  if (!missing.empty() && follower_ && follower_->Follows(req->job())) {
    CallLimiter::Slot slot;  // held while it waits on the sources
    s = AdmitPeerCall(req->session(), &slot);
    if (s.ok()) s = follower_->Fetch(g.tag, missing, AnswerBy(ctx, clock_));
    const uint64_t version = g.tag.version;
    tce::Status released = versions_->ReleaseVersion(req->session(), g.lease_id);
    if (!s.ok()) return ToGrpc(s);
    if (!released.ok()) return ToGrpc(released);
    std::vector<uint64_t> unmap = std::move(g.unmap_buffer_ids);
    g = VersionGrant();
    s = versions_->AcquireVersion(req->session(), req->job(), version, lease, &g);
    if (!s.ok()) return ToGrpc(s);
    g.unmap_buffer_ids.insert(g.unmap_buffer_ids.begin(), unmap.begin(), unmap.end());
  }
  ToProto(g.tag, resp->mutable_tag());
  resp->set_lease_id(g.lease_id);
  resp->set_lease_s(g.lease.count() / 1000.0);
  for (const FileInfo& f : g.files) ToProto(f, resp->add_files());
  for (uint64_t id : g.unmap_buffer_ids) resp->add_unmap_buffer_ids(id);
  return grpc::Status::OK;
}

grpc::Status CacheService::RenewVersion(grpc::ServerContext*, const v1::RenewVersionRequest* req,
                                        v1::RenewVersionResponse* resp) {
  int64_t lease_ms = 0;
  if (tce::Status bad = CheckRequest(*req, &lease_ms); !bad.ok()) return ToGrpc(bad);
  std::chrono::milliseconds granted{0};
  tce::Status s = versions_->RenewVersion(req->session(), req->lease_id(), std::chrono::milliseconds(lease_ms),
                                       &granted);
  if (s.ok()) resp->set_lease_s(granted.count() / 1000.0);
  return ToGrpc(s);
}

grpc::Status CacheService::ReleaseVersion(grpc::ServerContext*, const v1::ReleaseVersionRequest* req,
                                          v1::ReleaseVersionResponse*) {
  if (tce::Status bad = CheckRequest(*req); !bad.ok()) return ToGrpc(bad);
  return ToGrpc(versions_->ReleaseVersion(req->session(), req->lease_id()));
}

grpc::Status CacheService::GrantRead(grpc::ServerContext*, const v1::GrantReadRequest* req,
                                     v1::GrantReadResponse* resp) {
  if (tce::Status bad = CheckRequest(*req); !bad.ok()) return ToGrpc(bad);
  ReadGrants::Ids ids{{req->uids().begin(), req->uids().end()},
                      {req->gids().begin(), req->gids().end()},
                      {req->nodes().begin(), req->nodes().end()}};
  tce::Status s = versions_->GrantRead(req->session(), req->job(), &ids, req->revoke());
  if (!s.ok()) return ToGrpc(s);
  for (uid_t u : ids.uids) resp->add_uids(u);
  for (gid_t g : ids.gids) resp->add_gids(g);
  for (const std::string& n : ids.nodes) resp->add_nodes(n);
  return grpc::Status::OK;
}

grpc::Status CacheService::Follow(grpc::ServerContext* ctx, const v1::FollowRequest* req,
                                  v1::FollowResponse* resp) {
  if (tce::Status bad = CheckRequest(*req); !bad.ok()) return ToGrpc(bad);
  if (!follower_)
    return ToGrpc(tce::Status::FailedPrecondition(
        "this server takes part in no ring: start it with peer_listen and a peer token to follow a job"));
  uid_t uid = 0;
  gid_t gid = 0;
  tce::Status s = sessions_->CallerIds(req->session(), &uid, &gid);
  CallLimiter::Slot slot;
  if (s.ok()) s = AdmitPeerCall(req->session(), &slot);
  TagInfo newest;
  if (s.ok())
    s = follower_->Follow(req->job(), {req->sources().begin(), req->sources().end()}, uid, AnswerBy(ctx, clock_),
                          &newest);
  if (s.ok() && newest.version) ToProto(newest, resp->mutable_newest());
  return ToGrpc(s);
}

}  // namespace tce
