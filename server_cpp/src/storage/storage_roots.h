// StorageRoots: the `storage_roots` setting, built once at start, and the one
// place that answers "which store holds this path". The cache, the
// persister, the retention and the daemon share one (const) and ask it;
// none of them maps a path to a root itself.
//
// Two kinds of root, one answer, Locate: the store and its key.
//   * A directory root ("DIR") is a PosixStore (storage/posix_store.h). A
//     path under it is located by resolving its directory now, symlinks
//     followed as the user's own open would follow them, and taking the
//     longest root the result lies under; the key is the resolved directory
//     below that root and the file's name. The store then opens that
//     directory from the root one component at a time without following
//     symlinks, so a link swapped in after the resolution redirects nothing.
//     Reads, listings and checks open directories the same way
//     (OpenDirectory).
//   * An object root ("DIR=URL") is lexical: the key is the URL's prefix and
//     the path below DIR. An object root has no directories to resolve, and
//     `..` was refused before.
// An object root wins over a directory root above it (`/ckpt` and
// `/ckpt/s3=s3://b`: /ckpt/s3/x is the bucket's).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "common/status.h"
#include "env/env.h"
#include "storage/backends.h"
#include "storage/object_roots.h"
#include "storage/object_store.h"
#include "storage/posix_store.h"

namespace tce {

class StorageRoots {
 public:
  // Parses `setting` ("DIR" or "DIR=URL", comma-separated: ParseStorageRoots)
  // and opens every root's store with its backend's options. A directory
  // root must exist and be a directory (a missing root is a missing mount:
  // never created). INVALID_ARGUMENT / NOT_FOUND saying which root.
  static Status Open(const std::string& setting, const StorageOptions& options,
                     std::shared_ptr<StorageRoots>* out);

  // Directory roots `dirs` (absolute; resolved here, once) written through
  // PosixStores made with `file` (whose env every filesystem call goes
  // through), and the object roots `objects` (null: none).
  StorageRoots(const std::vector<std::string>& dirs, std::shared_ptr<ObjectRoots> objects,
               PosixStoreOptions file);
  // No root: memory only.
  StorageRoots() : StorageRoots({}, nullptr, PosixStoreOptions()) {}
  StorageRoots(const StorageRoots&) = delete;
  StorageRoots& operator=(const StorageRoots&) = delete;

  bool empty() const { return dirs_.empty() && objects_->empty(); }
  bool has_dirs() const { return !dirs_.empty(); }
  const std::vector<std::string>& dirs() const { return dirs_; }  // resolved
  const ObjectRoots& objects() const { return *objects_; }
  ObjectRoots& objects() { return *objects_; }  // the daemon's: start and cancel transfers
  Env* env() const { return env_; }
  // "DIR, DIR=URL": every root, for messages and the start-up log; "" when none.
  std::string Describe() const;

  // Where `path` (absolute, normalised) is stored now.
  struct Location {
    ObjectStore* store = nullptr;
    std::string key;
    const ObjectRoot* object = nullptr;  // its object root; null for a directory root
    std::string root;                    // the directory root (object roots: "")
    std::string dir;                     // the path's directory as resolved (object roots: "")
  };
  // PERMISSION_DENIED when the path lies under no root (its directory
  // resolving outside every directory root counts); the resolution's error
  // (NOT_FOUND: no such directory) as it is.
  Status Locate(const std::string& path, Location* out) const;
  // The root `path` is stored under, as `dirs()` and the object roots' DIR
  // name it, judged by the path as written (the root as configured or as
  // resolved): lexical, no filesystem call; "" when it lies under none.
  // For status figures by root.
  std::string RootName(const std::string& path) const;
  // The object root `path` lies under and its key (null: none). Lexical: no
  // filesystem call.
  const ObjectRoot* ObjectRootOf(const std::string& path, std::string* key) const;
  // Whether a save may name `path`: OK under a directory root (resolved) or
  // an object root whose store takes its key; else PERMISSION_DENIED
  // listing the roots (INVALID_ARGUMENT for a key the store cannot hold).
  // OK for any path when there is no root.
  Status CheckUnder(const std::string& path) const;
  // The directory `dir` of a directory root, resolved now and opened
  // through its PosixStore (nothing created): `resolved` (optional) gets
  // the resolved path, also when the open fails after resolving.
  Status OpenDirectory(const std::string& dir, std::unique_ptr<Directory>* out,
                       std::string* resolved = nullptr) const;

 private:
  // The directory root `resolved` lies under (the longest), or -1.
  int DirRootOf(const std::string& resolved) const;

  Env* const env_;
  std::vector<std::string> dirs_;
  std::vector<std::string> configured_;  // configured_[i]: dirs_[i] as the setting names it
  std::vector<std::shared_ptr<PosixStore>> dir_stores_;  // dir_stores_[i] holds dirs_[i]
  const std::shared_ptr<ObjectRoots> objects_;
};

}  // namespace tce
