// Persister: worker threads that write committed files to storage, off the
// training rank's critical path. Each file: one pass over the buffer computes
// every record's CRC-32 and patches the CRC fields in place (the cached copy
// and the file hold the same bytes), then the buffer is written straight from
// its mapping into a temp file in the target directory, with O_DIRECT where
// the filesystem allows (DMA, no copy through the page cache: about 2x faster
// on a 2-core virtual machine's disk, and far less CPU taken from training),
// else buffered with writeback started per chunk; fdatasync, rename over the final path, fsync
// of the directory. The final path never holds a torn file. A root server
// writes with the committing client's uid/gid (fsuid), never as root. I/O
// errors are retried with exponential backoff; after the retries the file is
// FAILED with the reason (and stays in memory).
//
// Deletes are honoured: a file is written only into the directory its save
// found (never created; only a file recovered from the ring, whose save this
// server never saw, may create directories below the root), and only while
// the path still holds what the save found there (or the file this server
// wrote last). A directory removed, made again or replaced, or a file deleted,
// replaced or modified since, makes the attempt CANCELLED: the cache then
// DISCARDS the save (see cache/storage_check.h). A file that replaces one
// keeps that file's permission bits; a new file gets the saver's
// (0666 & ~umask).
//
// Confinement: the root check at Allocate is not trusted at write time. Each
// attempt resolves the file's directory, requires it under a storage root,
// and opens it from the root one component at a time without following
// symlinks (Env::OpenDirectory); the temp file is unnamed (O_TMPFILE) or has
// an unguessable name made with O_EXCL|O_NOFOLLOW, and is renamed within
// that directory fd. So no symlink planted or swapped in at any moment
// redirects a write, and a temp name never depends on the final name's length.
// Start/Stop from one controlling thread.
#pragma once

#include <atomic>
#include <chrono>
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

namespace tce {

struct PersistOptions {
  TransferMetrics* metrics = nullptr;  // observes each file persisted or failed attempt (optional)
  int threads = 2;
  int retries = 5;  // attempts after the first
  std::chrono::milliseconds backoff{200};  // doubled per attempt
  size_t chunk = 16 << 20;                 // bytes per write()
  bool direct_io = true;                   // O_DIRECT where the filesystem supports it
  // O_DIRECT writes in flight per file: one write at a time leaves a disk
  // idle between requests (the page cache hides that for buffered writes).
  int io_depth = 4;
  // Between chunks a worker waits while a save is being written (training
  // comes first), at most this long in all for one file.
  std::chrono::milliseconds max_yield{5000};
  int nice = 10;                           // CPU priority of the workers (0: unchanged)
  // Temp files are named this + 16 random hex digits (where the filesystem
  // has no unnamed files); one prefix per server, so a restart removes its
  // own crashed temp files and never another server's in a shared directory.
  std::string temp_prefix = ".tce-";
  // A file whose persistence failed for a reason that may clear (disk full,
  // I/O errors) is tried again after this long while in memory (0: never).
  std::chrono::milliseconds failed_retry{30000};
  Clock* clock = Clock::Real();  // backoff, retries and timings are measured on it
  // Object storage roots (storage/object_store.h): files under them are
  // written as objects (persist/object_persist.cc), not files.
  std::shared_ptr<const ObjectRoots> objects;
};

class Persister {
 public:
  Persister(PersistSource* cache, Env* env, PersistOptions options);
  ~Persister();
  void Start();
  void Stop();  // abandons retries; in-flight writes finish their current attempt

  // At start: removes the temp files a crash left (those `temp_prefix` could
  // have named) from the directories of `paths` that lie under `roots`.
  // Returns how many it removed.
  static int RemoveStaleTemps(Env* env, const std::vector<std::string>& roots,
                              const std::vector<std::string>& paths, const std::string& temp_prefix);

 private:
  void Loop();
  // One attempt: write `data` (the mapped buffer, `mapped` bytes) to a temp
  // file and rename it into place. Each chunk not yet seen by `crcs` is fed
  // to it just before it is written (patching the CRC fields in the buffer),
  // so a retry resumes the CRCs where a failed attempt stopped.
  Status PersistOnce(const PersistJob& job, unsigned char* data, uint64_t mapped, bool direct,
                     ZipCrcStream* crcs, std::chrono::milliseconds* yielded, FileStat* written);
  // A file under an object root: the CRCs patched in one pass, then one
  // object written whole (multipart, parts in parallel), made visible only
  // if the version is still current and the key still holds what the save
  // found there. `written` gets the object's size and ETag.
  Status PersistObject(const PersistJob& job, const ObjectRoot& root, const std::string& key,
                       std::vector<Record>* records, FileStat* written);
  // `written`: the file now at the path (on success).
  Status Persist(const PersistJob& job, std::vector<Record>* records, FileStat* written);
  // The directory of `path`, opened beneath its storage root (see above),
  // created where missing only if `create`.
  Status OpenTargetDir(const std::string& path, bool create, std::unique_ptr<Directory>* out);
  bool SleepUnlessStopping(std::chrono::milliseconds d);
  // Whether `dir`, opened for `path` when the attempt began, is still the
  // directory at that path, as the save found it.
  StorageCheck StillThere(const std::string& path, Directory* dir, const DiskIdentity& expected);

  PersistSource* const cache_;
  PersistQueue queue_;  // fed by the cache (PersistSource::SetPersistFeed)
  Env* const env_;
  const PersistOptions options_;
  std::vector<std::thread> threads_;
  Mutex rename_mu_;  // orders "is this version current?" + rename
  Mutex stop_mu_;
  CondVar stop_cv_;
  bool stop_ GUARDED_BY(stop_mu_) = false;
};

}  // namespace tce
