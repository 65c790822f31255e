// Persister: worker threads that write committed files to storage, off the
// training rank's critical path, each through the storage interface
// (storage/object_store.h) of the root it lies under: a directory root's
// PosixStore (temp file, O_DIRECT where the filesystem allows, fdatasync,
// rename, fsync of the directory) or an object root's store (multipart
// upload, visible only complete). The buffer is written straight from its
// mapping; as the bytes go, every zip record's CRC-32 is computed and
// patched in place (the cached copy and storage hold the same bytes), and
// the worker yields to saves in flight. A root server writes with the
// committing client's uid/gid (fsuid), never as root. Failures are retried
// with exponential backoff; after the retries the file is FAILED with the
// reason (and stays in memory).
//
// Each object root has workers of its own (`threads` of them), and the
// directory roots theirs: a root whose storage stops answering holds only
// its own workers, and the files of the other roots go on persisting.
//
// Deletes are honoured: a file is written only into the directory its save
// found (never created; only a file recovered from the ring, whose save this
// server never saw, may create directories below the root), and only while
// the path still holds what the save found there (or the file this server
// wrote last): the save's identity goes to the store as
// WriteOptions::expected. A directory removed, made again or replaced, or a
// file (object) deleted, replaced or modified since, makes the attempt
// CANCELLED: the cache then DISCARDS the save (see cache/storage_check.h).
// A file that replaces one keeps that file's permission bits; a new file
// gets the saver's (0666 & ~umask).
//
// Confinement: the root check at Allocate is not trusted at write time. Each
// attempt resolves the file's directory and requires it under a storage
// root; the PosixStore then opens it from the root one component at a time
// without following symlinks and renames within that directory fd (see
// storage/posix_store.h). Start/Stop from one controlling thread.
#pragma once

#include <atomic>
#include <chrono>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "cache/persist_source.h"
#include "cache/storage_check.h"
#include "common/clock.h"
#include "common/metrics.h"
#include "common/mutex.h"
#include "env/env.h"
#include "persist/crc.h"
#include "persist/persist_queue.h"
#include "storage/object_store.h"
#include "storage/storage_roots.h"

namespace tce {

struct PersistOptions {
  TransferMetrics* metrics = nullptr;  // observes each file persisted or failed attempt (optional)
  int threads = 2;  // per lane: the directory roots, and each object root
  int retries = 5;  // attempts after the first
  std::chrono::milliseconds backoff{200};  // doubled per attempt
  // Between chunks a worker waits while a save is being written (training
  // comes first), at most this long in all for one file.
  std::chrono::milliseconds max_yield{5000};
  int nice = 10;                           // CPU priority of the workers (0: unchanged)
  // A file whose persistence failed for a reason that may clear (disk full,
  // I/O errors) is tried again after this long while in memory (0: never).
  std::chrono::milliseconds failed_retry{30000};
  Clock* clock = Clock::Real();  // backoff, retries and timings are measured on it
  // Where each file is written (storage/storage_roots.h: the store and key
  // of its path, asked at each attempt); null: nowhere (every attempt fails).
  // How a directory root writes (chunks, O_DIRECT, writes in flight, temp
  // names) is its PosixStore's, StorageOptions::file.
  std::shared_ptr<const StorageRoots> storage;
};

class Persister {
 public:
  // The queue its workers take from (made by MakeQueue with the same
  // options, and given to the Cache as its CacheOptions::persist_feed
  // first) and `cache` outlive it.
  Persister(PersistSource* cache, PersistQueue* queue, Env* env, PersistOptions options);
  // The queue for a Persister of `options`: its retry interval and clock,
  // a lane for the directory roots and one for each object root.
  static std::unique_ptr<PersistQueue> MakeQueue(const PersistOptions& options);
  ~Persister();
  void Start();
  void Stop();  // abandons retries; in-flight writes finish their current attempt

  // At start: removes the temp files a crash left (those `temp_prefix` could
  // have named) from the directories of `paths` that lie under a directory
  // root of `roots`. Returns how many it removed.
  static int RemoveStaleTemps(const StorageRoots& roots, const std::vector<std::string>& paths,
                              const std::string& temp_prefix);

 private:
  void Loop(size_t lane);  // a worker of the queue's lane
  // The store and key `job`'s path is written to now (StorageRoots::Locate);
  // CANCELLED when its directory is not the one the save found any more.
  Status StoreOf(const PersistJob& job, ObjectStore** store, std::string* key);
  // The job's buffer as Persist maps it; unmapped when destroyed, which the
  // worker does after FinishPersist (tearing down a GiB's page tables takes
  // ~25 ms, not the write's time).
  struct Mapping {
    Mapping() = default;
    Mapping(const Mapping&) = delete;
    Mapping& operator=(const Mapping&) = delete;
    ~Mapping();
    void* addr = nullptr;
    size_t len = 0;
  };
  // Writes the job's buffer (mapped into `map`) through its store, retried
  // with backoff; `written`: the file or object now at the path (on success).
  Status Persist(const PersistJob& job, Mapping* map, std::vector<Record>* records, FileStat* written);
  bool SleepUnlessStopping(std::chrono::milliseconds d);
  PersistSource* const cache_;
  PersistQueue* const queue_;  // fed by the cache (CacheOptions::persist_feed)
  Env* const env_;
  const PersistOptions options_;
  std::vector<std::thread> threads_;
  Mutex stop_mu_;
  CondVar stop_cv_;
  bool stop_ GUARDED_BY(stop_mu_) = false;
};

}  // namespace tce
