// CacheOptions: how a Cache is built (cache/cache.h). The daemon fills it from
// the settings (daemon/daemon.cc: MakeCache); a test names what it needs and
// leaves the rest to the defaults. Nothing here changes once the Cache serves.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "cache/backup_feed.h"
#include "cache/memory_backing.h"
#include "cache/meta_sink.h"
#include "cache/persist_feed.h"
#include "cache/restore_tracker.h"
#include "cache/session_limits.h"
#include "cache/tag_feed.h"
#include "common/clock.h"
#include "env/env.h"
#include "storage/storage_roots.h"

namespace tce {

struct CacheOptions {
  // A budget alone, the rest the defaults: `Cache cache(64 << 20)`.
  CacheOptions(uint64_t budget = 0) : budget_bytes(budget) {}  // NOLINT(google-explicit-constructor)

  uint64_t budget_bytes;  // every buffer's bytes, the pool's included
  // Where files are persisted (storage/storage_roots.h), shared with the
  // persister; null or empty: the cache is memory only.
  std::shared_ptr<const StorageRoots> storage;
  // Where committed files are queued for persistence (persist/persist_queue.h,
  // made before the Cache and taken by the persister; null: nowhere, they
  // stay in memory). It outlives the Cache.
  PersistFeed* persist_feed = nullptr;
  // Where the ring's work is queued (ring/backup_queue.h, made before the
  // Cache and taken by the replicator; null: nowhere, no file is backed
  // up). It outlives the Cache.
  BackupFeed* backup_feed = nullptr;
  // Told the job of every tag recorded complete (persist/storage_retention.h's
  // queue, made before the Cache; null: nobody). It outlives the Cache.
  TagFeed* tag_feed = nullptr;
  Env* env = Env::Default();
  Clock* clock = Clock::Real();  // what every timeout and time stamp is read from
  // How long an allocation that finds the cache full of not-yet-persisted
  // files waits for persistence.
  std::chrono::milliseconds full_timeout = std::chrono::seconds(30);
  // Per job, files of tags older than the newest `keep_last` are evicted
  // once persisted (0: keep all while there is room).
  size_t keep_last = 0;
  // How long a load (or a save's look at its directory) waits for storage
  // to answer a stat before it serves the cache (goes on unchecked); <= 0:
  // no limit.
  std::chrono::milliseconds storage_check_timeout = std::chrono::seconds(2);
  // How long a load waits for an in-flight ring restore of its job (for the
  // Cache's own tracker, when `restores` is null).
  std::chrono::milliseconds restore_wait = std::chrono::seconds(120);
  // The jobs being restored from the ring, shared with the loads that wait
  // for them (null: the Cache makes one).
  std::shared_ptr<RestoreTracker> restores;
  // Whether a directory root's file a load missed is read into the cache
  // here, so the ranks of a node share one read (cooperative_restore). An
  // object root's always is.
  bool fetch_files = false;
  SessionLimits limits;  // authorization and per-session, per-uid bounds
  // Where every state change is recorded (cache/meta_sink.h; null: nowhere).
  MetaSink* meta = nullptr;
  // What new buffers are made of. A hugetlb buffer's capacity is rounded up
  // to 2 MiB; when no huge page is left, a buffer is made with 4 KiB pages
  // (logged, counted).
  Backing backing = Backing::k4k;
  // Bytes of buffers made ahead by a pool (cache/buffer_pool.h) that new
  // buffers come from first (0: none); it fills once Cache::pool() starts.
  uint64_t prealloc = 0;
};

}  // namespace tce
