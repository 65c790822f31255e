// CacheService: what the server reports of itself (Status): its memory,
// persistence, ring and metadata, filtered for a caller who is no
// administrator. See rpc/service.h.
#include <unistd.h>

#include <chrono>

#include "rpc/request_checks.h"
#include "rpc/service.h"

namespace tce {

grpc::Status CacheService::Status(grpc::ServerContext*, const v1::StatusRequest* req,
                                  v1::StatusResponse* resp) {
  if (tce::Status bad = CheckRequest(*req); !bad.ok()) return ToGrpc(bad);
  bool admin = false;
  uid_t uid = 0;
  tce::Status s = sessions_->CheckCaller(req->session(), &admin, &uid);
  if (!s.ok()) return ToGrpc(s);
  FillStatus(resp, admin, uid);
  if (!admin) {  // they may name other users' jobs and paths
    resp->clear_backup_error();
    resp->clear_metadata_error();
  }
  return grpc::Status::OK;
}

void CacheService::FillStatus(v1::StatusResponse* resp, bool loads_admin, uid_t loads_uid) {
  CacheStats s = cache_->Stats();
  resp->set_version(TCE_VERSION);
  resp->set_pid(getpid());
  resp->set_uptime_s(std::chrono::duration<double>(clock_->Now() - started_).count());
  resp->set_budget_bytes(s.budget);
  resp->set_used_bytes(s.used);
  resp->set_cached_bytes(s.cached);
  resp->set_pending_bytes(s.pending);
  resp->set_free_bytes(s.free);
  resp->set_buffers(s.buffers);
  resp->set_files(s.files);
  resp->set_sessions(s.sessions);
  resp->set_leases(s.leases);
  resp->set_version_leases(s.version_leases);
  resp->set_metadata_bytes(s.metadata_bytes);
  resp->set_metadata_budget(s.metadata_budget);
  resp->set_replica_files(s.replica_files);
  resp->set_version_ranges_served(s.version_ranges_served);
  resp->set_versions_published(s.versions_published);
  for (const CacheStats::RootStats& r : s.roots) {
    v1::RootStatus* out = resp->add_roots();
    out->set_root(r.root);
    out->set_url(r.url);
    out->set_queued_files(r.queued_files);
    out->set_queued_bytes(r.queued_bytes);
    out->set_written_files(r.written_files);
    out->set_written_bytes(r.written_bytes);
    out->set_failed_files(r.failed_files);
    out->set_retries(r.retries);
    out->set_held_markers(r.held_markers);
  }
  for (const std::string& r : s.object_roots) resp->add_object_roots(r);
  resp->set_objects_fetched(s.objects_fetched);
  resp->set_object_bytes_fetched(s.object_bytes_fetched);
  resp->set_object_retries(s.object_retries);
  resp->set_object_ranges_read(s.object_ranges_read);
  resp->set_held_markers(s.held_markers);
  resp->set_marker_rounds(s.marker_rounds);
  resp->set_object_fetches_shared(s.object_fetches_shared);
  for (const JobLoadSplit& j : stored_->LoadSplits(loads_admin, loads_uid)) {
    v1::JobLoads* out = resp->add_job_loads();
    out->set_job(j.job);
    out->set_cache_bytes(j.cache_bytes);
    out->set_peer_bytes(j.peer_bytes);
    out->set_storage_bytes(j.storage_bytes);
    out->set_storage_files(j.storage_files);
    out->set_peer_files(j.peer_files);
    out->set_for_peers_bytes(j.for_peers_bytes);
  }
  if (prefetch_) {
    for (const OperationProgress& op : prefetch_->Running(loads_admin, loads_uid)) {
      v1::RunningOperation* out = resp->add_operations();
      out->set_kind(op.kind);
      out->set_job(op.job);
      out->set_tag(op.tag);
      out->set_from(op.from);
      out->set_files_done(op.files_done);
      out->set_files_total(op.files_total);
      out->set_files_failed(op.files_failed);
      out->set_bytes_done(op.bytes_done);
      out->set_bytes_total(op.bytes_total);
      out->set_started_unix_ms(op.started_unix_ms);
      out->set_elapsed_s(op.elapsed_s);
    }
  }
  for (const JobReaders& r : versions_ ? versions_->Readers(loads_admin, loads_uid) : std::vector<JobReaders>{}) {
    v1::VersionReaders* out = resp->add_version_readers();
    out->set_job(r.job);
    out->set_newest_version(r.newest);
    out->set_oldest_leased(r.oldest_leased);
    out->set_leases(r.leases);
  }
  resp->set_socket(socket_path_);
  resp->set_buffers_created(s.buffers_created);
  resp->set_buffers_reused(s.buffers_reused);
  resp->set_memory_backing(s.memory_backing);
  resp->set_huge_page_buffers(s.huge_page_buffers);
  resp->set_hugetlb_fallbacks(s.hugetlb_fallbacks);
  resp->set_pool_target_bytes(s.pool.target);
  resp->set_pool_bytes(s.pool.held);
  resp->set_pool_taken(s.pool.taken);
  resp->set_pool_missed(s.pool.missed);
  resp->set_pool_filling(s.pool.filling);
  for (const std::string& root : cache_->storage().dirs()) resp->add_storage_roots(root);
  resp->set_persist_queue(s.persist_queue);
  resp->set_persisted_files(s.persisted_files);
  resp->set_persisted_bytes(s.persisted_bytes);
  resp->set_failed_files(s.failed_files);
  resp->set_evicted_files(s.evicted_files);
  resp->set_discarded_files(s.discarded_files);
  resp->set_stale_drops(s.stale_drops);
  resp->set_storage_fallbacks(s.storage_fallbacks);
  resp->set_metadata_url(metadata_url_);
  resp->set_peer_endpoint(peer_endpoint_);
  resp->set_backup_queue(s.backup_queue);
  resp->set_backup_lag_bytes(s.backup_lag_bytes);
  resp->set_backed_up_files(s.backed_up_files);
  resp->set_backup_failures(s.backup_failures);
  resp->set_backup_failing(s.backup_failing);
  resp->set_backup_error(s.backup_error);
  resp->set_recovered_files(s.recovered_files);
  resp->set_ring_checksum_mismatches(s.ring_checksum_mismatches);
  resp->set_remote_reads(ring_fetch_ ? ring_fetch_->remote_reads() : 0);
  resp->set_remote_misses(ring_fetch_ ? ring_fetch_->remote_misses() : 0);
  resp->set_ring_transport(ring_transport_);
  if (ranges_) {
    resp->set_range_reads_local(ranges_->local_reads());
    resp->set_range_reads_held(ranges_->held_reads());
    resp->set_range_reads_peer(ranges_->peer_reads());
    resp->set_range_peer_bytes(ranges_->peer_bytes());
  }
  resp->set_metrics_endpoint(metrics_endpoint_);
  resp->set_health_endpoint(health_endpoint_);
  if (backups_) {
    BackupStoreStats b = backups_->Stats();
    resp->set_held_backups(b.files);
    resp->set_held_backup_bytes(b.bytes);
    resp->set_held_tags(b.tags);
    resp->set_backup_budget_bytes(b.budget);
  }
  if (meta_) {
    MetaStatus m = meta_->Status();
    resp->set_metadata_healthy(m.healthy);
    resp->set_metadata_queue(m.queued);
    resp->set_metadata_error(m.last_error);
  }
  if (follower_) {
    for (const FollowedJobInfo& j : follower_->Jobs(loads_admin, loads_uid)) {
      v1::FollowedJob* out = resp->add_followed_jobs();
      out->set_job(j.job);
      for (const std::string& source : j.sources) out->add_sources(source);
      out->set_version(j.version);
      out->set_state(j.failures ? v1::FOLLOW_STATE_RETRYING : v1::FOLLOW_STATE_FOLLOWING);
      out->set_failures(j.failures);
      out->set_last_error(j.last_error);
      out->set_retry_in_s(j.retry_in.count() / 1000.0);
    }
  }
}

}  // namespace tce
