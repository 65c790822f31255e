// PosixStore: an ObjectStore over one directory root of a filesystem. A key
// is a path below the root ("a/b/x.pt"); Write makes a temp file in the
// key's directory (unnamed where the filesystem allows), writes it straight
// from the caller's mapping, with O_DIRECT where the filesystem takes it
// (DMA, no copy through the page cache) and several writes in flight, else
// buffered with writeback started per chunk; fdatasync, rename over the
// final name, fsync of the directory. The final name never holds a torn
// file; a crash leaves at most a temp file that
// Persister::RemoveStaleTemps finds by its prefix. The version the rename
// replaced is freed after the write returns, on a thread of the store's
// (freeing a large file's blocks takes longer than a rename: ~140 ms a GiB
// on ext4, a quarter of writing it).
//
// Confinement: every call opens the key's directory from the root one
// component at a time without following symlinks (Env::OpenDirectory), and
// renames within that directory fd, so no symlink planted or swapped in at
// any moment redirects a write or a read outside the root. A root server
// writes with the identity WriteOptions names (fsuid), never as root.
//
// Coherence (WriteOptions::expected): the directory must still be the one
// the save found (not removed, not made again) when the write begins and
// again, reopened from the root, just before the rename, and the name must
// still hold the file the save found (or nothing); else CANCELLED with the
// reason. Renames of one store are ordered with their last look.
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "common/mutex.h"
#include "env/env.h"
#include "storage/object_store.h"

namespace tce {

struct PosixStoreOptions {
  Env* env = nullptr;            // every call goes through it (required)
  size_t chunk = 16 << 20;       // bytes per write()
  bool direct_io = true;         // O_DIRECT where the filesystem allows it
  int io_depth = 4;              // O_DIRECT writes in flight per file
  std::string temp_prefix = ".tce-";  // of named temp files (one per server)
};

class PosixStore : public ObjectStore {
 public:
  // `location`: "/ABSOLUTE/DIR" (a file:// URL's rest), no '..' component.
  static Status CheckLocation(const std::string& location);
  // The store of the directory `location`; `prefix` gets "" (keys are
  // paths below it).
  static Status Open(const std::string& location, const PosixStoreOptions& options,
                     std::shared_ptr<ObjectStore>* out, std::string* prefix);
  // `root`: absolute, normalised, trusted (a configured storage root).
  PosixStore(std::string root, const PosixStoreOptions& options);
  ~PosixStore() override;  // frees what is still waiting to be

  const std::string& root() const { return root_; }
  std::string Url(const std::string& key) const override;
  // Any key: a name too long for the filesystem fails the save itself
  // (ENAMETOOLONG), as torch.save would.
  Status CheckKey(const std::string&) const override { return Status::OK(); }
  Status Write(const std::string& key, const char* data, uint64_t n, const WriteOptions& options,
               FileStat* out) override;
  bool Retryable(const Status&) const override { return true; }  // disk full, EIO: may clear
  // `who` is not looked at: the kernel checks a directory root's files
  // (the server reads and lists them as the user, cache/cache_fetch.cc).
  Status Read(const std::string& key, uint64_t offset, uint64_t n, char* into, const std::string& etag,
              const Requester& who) override;
  Status Stat(const std::string& key, ObjectId* out) override;
  Status List(const std::string& prefix, const Requester& who, std::vector<ListedObject>* out) override;
  Status Delete(const std::string& key, const Requester& who) override;
  // Temp files are named per server and found per directory by
  // Persister::RemoveStaleTemps; a filesystem keeps no other unfinished write.
  int AbandonUnfinished() override { return 0; }
  void Cancel() override {}
  uint64_t retries() const override { return 0; }

  // A file's identity as an ETag ("dev-ino-size-mtime"), for callers that
  // compare what Stat says across calls.
  static std::string EtagOf(const FileStat& st);

  // The directory `dir_key` below the root ("": the root itself), opened
  // from the root one component at a time without following symlinks
  // (created where missing only if `create`): the reads, listings and
  // checks of storage/storage_roots.h open directories here, as writes do.
  Status OpenDirectory(const std::string& dir_key, bool create, std::unique_ptr<Directory>* out) const;

 private:
  // The key's directory (created where missing only if `create`) and name.
  Status OpenDir(const std::string& key, bool create, std::unique_ptr<Directory>* dir, std::string* name,
                 std::string* dir_path) const;
  Status WriteOnce(const std::string& key, const char* data, uint64_t n, const WriteOptions& options,
                   bool direct, FileStat* out);
  // Whether `dir`, opened at `dir_path` when the write began, is still the
  // directory at that path, as the save found it.
  StorageCheck StillThere(const std::string& dir_path, const std::string& url, Directory* dir,
                          const DiskIdentity& expected);

  // Destroys `file` on the releaser thread (started on first use; inline
  // where no thread can start): a published TempFile holds the file it
  // replaced until then.
  void Release(std::unique_ptr<TempFile> file);
  void ReleaseLoop();

  const std::string root_;
  const PosixStoreOptions options_;
  Mutex publish_mu_;  // orders each write's last look with its rename
  Mutex release_mu_;
  CondVar release_cv_;
  std::vector<std::unique_ptr<TempFile>> released_ GUARDED_BY(release_mu_);
  bool stopping_ GUARDED_BY(release_mu_) = false;
  std::thread releaser_ GUARDED_BY(release_mu_);
};

}  // namespace tce
