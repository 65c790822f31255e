// ClientStore: the files of the Cache as the RPC layer (rpc/service.h)
// serves them to local clients: saves, loads, listings, tags, waits. The
// rest of what clients reach is an interface per concern, put together as
// ClientStores: sessions and buffers' fds (session_store.h), files as
// storage holds them (stored_files.h), published versions
// (version_store.h), a job's ring (client_rings.h); and beside the Cache,
// the restores a load waits for (restore_tracker.h).
//
// Security: every client call names a session (opened by the fd socket after
// its SO_PEERCRED check) and acts with that session's uid: a job's files and
// tags are readable, replaceable and removable by its owner only (and root
// when root_is_admin; see job_owners.h). A buffer only ever holds the bytes of
// one uid: a free buffer is reused for the same uid, never handed to another
// (another uid gets a new, zero-filled one). Leases per session are capped.
//
// The Cache is one. Thread-safe: gRPC's worker threads and the fd socket's
// thread call it at once.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <functional>
#include <cstdint>
#include <string>
#include <vector>

#include "cache/buffer_pool.h"  // PoolStats
#include "cache/cache_types.h"
#include "cache/client_rings.h"
#include "cache/file_state.h"
#include "cache/load_split.h"
#include "cache/read_grants.h"
#include "cache/record.h"
#include "cache/restore_tracker.h"
#include "cache/session_store.h"
#include "cache/stored_files.h"
#include "cache/version_store.h"
#include "common/clock.h"
#include "common/status.h"
#include "storage/identity.h"  // ObjectId
#include "storage/storage_roots.h"

namespace tce {

struct AllocateRequest {
  std::string session, job, tag, path;
  int32_t rank = 0;
  uint64_t size = 0;
  uint32_t mode = 0644;  // permission bits if the file is new on storage
};

struct AllocateResult {
  uint64_t allocation_id = 0;
  uint64_t buffer_id = 0;
  uint64_t capacity = 0;
  std::vector<uint64_t> unmap_buffer_ids;
};

struct CacheStats {
  uint64_t budget = 0, used = 0, cached = 0, pending = 0, free = 0, retiring = 0;
  uint64_t buffers = 0, files = 0, sessions = 0, leases = 0, version_leases = 0;
  uint64_t replica_files = 0, version_ranges_served = 0;  // followed versions (docs/weights.md)
  uint64_t versions_published = 0;  // complete tags recorded, followed versions learned, since start
  uint64_t metadata_bytes = 0, metadata_budget = 0;        // MetadataQuota (cache/metadata_quota.h)
  std::vector<std::string> object_roots;  // "DIR=URL"
  // Persistence by root (StorageRoots::RootName), directory roots first.
  struct RootStats {
    std::string root, url;  // url: an object root's ("" for a directory root)
    uint64_t queued_files = 0, queued_bytes = 0;    // committed, waiting for or in persistence
    uint64_t written_files = 0, written_bytes = 0;  // persisted since start
    uint64_t failed_files = 0;
    uint64_t retries = 0, held_markers = 0;  // object roots: requests retried, tag markers held
  };
  std::vector<RootStats> roots;
  uint64_t objects_fetched = 0, object_bytes_fetched = 0, object_retries = 0, object_ranges_read = 0;
  uint64_t held_markers = 0, marker_rounds = 0, object_fetches_shared = 0;
  uint64_t buffers_created = 0, buffers_reused = 0;
  uint64_t persist_queue = 0, persisted_files = 0, persisted_bytes = 0, failed_files = 0;
  uint64_t evicted_files = 0;
  uint64_t discarded_files = 0, stale_drops = 0, storage_fallbacks = 0;
  uint64_t backup_queue = 0, backup_lag_bytes = 0, backed_up_files = 0, backup_failures = 0;
  uint64_t backup_failing = 0;  // backup workers' attempts failed in a row (NoteRingAttempt)
  uint64_t recovered_files = 0, ring_checksum_mismatches = 0;
  uint64_t files_by_state[kFileStateSlots] = {};  // indexed by FileState's number
  bool accepting = true;            // false once a shutdown drain began
  std::string backup_error;
  // Memory backing and the pre-faulted pool.
  std::string memory_backing = "4k";  // what new buffers are made of
  uint64_t huge_page_buffers = 0;     // live buffers backed by huge pages (hugetlb or thp)
  uint64_t hugetlb_fallbacks = 0;     // buffers made with 4 KiB pages: no huge page was left
  PoolStats pool;                     // all zero without a pool
};

class ClientStore {
 public:
  virtual ~ClientStore() = default;

  virtual Status Allocate(const AllocateRequest& req, AllocateResult* out) = 0;
  // Without `zip_crc32` the zip headers keep the 0 CRCs the saver wrote.
  virtual Status Commit(const std::string& session, uint64_t allocation_id,
                        std::vector<Record> records, FileInfo* out, bool zip_crc32) = 0;
  virtual Status Abort(const std::string& session, uint64_t allocation_id) = 0;
  // The committed file; with `lease`, the buffer is kept until the lease ends.
  // With storage roots, the path is first compared with storage (Revalidate):
  // a file the user deleted or replaced there is NOT_FOUND (loads read
  // storage), and when storage cannot be checked the cache is served.
  virtual Status Lookup(const std::string& session, const std::string& job, const std::string& path,
                        bool lease, FileInfo* out, uint64_t* lease_id,
                        std::vector<uint64_t>* unmap_buffer_ids) = 0;
  // Validates every id first, then applies; unmap acks are idempotent.
  virtual Status Release(const std::string& session, const std::vector<uint64_t>& lease_ids,
                         const std::vector<uint64_t>& unmapped_buffer_ids) = 0;
  virtual Status Remove(const std::string& session, const std::string& job, const std::string& path,
                        FileInfo* out) = 0;
  // Files (CACHED and PENDING), filtered by non-empty job/tag, sorted, as
  // `session` may see them: only its uid's jobs unless admin. With
  // `check_storage`, each listed file with memory is revalidated first.
  virtual Status List(const std::string& session, const std::string& job, const std::string& tag,
                      std::vector<FileInfo>* out, bool check_storage) = 0;
  // Records that every rank finished `tag` (re-recording replaces it); fills
  // in complete_unix_ns and sorts the files. Tags are never removed.
  virtual Status CommitTag(const std::string& session, TagInfo tag, TagInfo* out) = 0;
  // The job's complete tags, oldest first: PERMISSION_DENIED for another
  // uid's job.
  virtual Status ListTags(const std::string& session, const std::string& job,
                          std::vector<TagInfo>* out) = 0;
  virtual CacheStats Stats() = 0;
  // Where files are persisted (storage/storage_roots.h; empty: memory only).
  virtual const StorageRoots& storage() const = 0;
  // Blocks until every named file is PERSISTED or FAILED (infos in `out`, in
  // order), or `timeout` passes (DEADLINE_EXCEEDED); <= 0 waits forever. A
  // blocked call ends when its caller goes: its session closes
  // (UNAUTHENTICATED) or `gone` says so (CANCELLED; asked at least every
  // kCallerGonePoll).
  virtual Status Wait(const std::string& session, const std::string& job,
                      const std::vector<std::string>& paths, std::chrono::milliseconds timeout,
                      std::vector<FileInfo>* out, const CallerGone& gone) = 0;
  // Persists FAILED files of `job` again now, whatever they failed of: the
  // named `paths` (each must be FAILED with its memory, else NOT_FOUND or
  // FAILED_PRECONDITION and nothing is queued), or with none every such file
  // of the job. `out`: the files queued.
  virtual Status RetryFailed(const std::string& session, const std::string& job,
                             const std::vector<std::string>& paths, std::vector<FileInfo>* out) = 0;

};

// What the RPC layer serves, one interface per concern; the Cache is or
// holds each of them (ClientStores::Of(&cache)).
struct ClientStores {
  ClientStore* files = nullptr;
  SessionStore* sessions = nullptr;
  StoredFiles* stored = nullptr;
  VersionStore* versions = nullptr;
  RestoreTracker* restores = nullptr;  // the jobs a load waits for (the Cache's tracker)
  ClientRings* rings = nullptr;        // a job's ring, ranged reads' check (the Cache's rings)
  template <class T>
  static ClientStores Of(T* all) {
    return {all, all->sessions(), all->storage_access(), all->publication(), all->restores(), all->rings()};
  }
};

}  // namespace tce
