// The storage backends: each a class implementing ObjectStore
// (storage/object_store.h) with options of its own, opened by the scheme of
// a root's URL through the table StorageBackends() returns (backends.cc).
//
// Adding one (say gcs://) is a file pair, storage/gcs_store.{h,cc}, whose
// class implements ObjectStore and has two static functions,
//   Status CheckLocation(const std::string& location);
//   Status Open(const std::string& location, const GcsStoreOptions& options,
//               std::shared_ptr<ObjectStore>* out, std::string* prefix);
// (`location`: the URL after "gcs://"; `prefix`: the key prefix it names),
// its options as a member of StorageOptions (filled from the server's
// settings in daemon/options.cc), and one entry in the table. The order in
// which the server calls a store's methods: docs/architecture.md, "Adding a
// storage backend".
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "common/status.h"
#include "storage/object_roots.h"
#include "storage/object_store.h"
#include "storage/posix_store.h"
#include "storage/s3_store.h"

namespace tce {

// Every backend's options (daemon/options.cc fills them from the settings).
struct StorageOptions {
  PosixStoreOptions file;  // directory roots (file://)
  S3StoreOptions s3;       // s3://
};

struct StorageBackend {
  const char* scheme;  // "s3": URLs "s3://..."
  // Whether `location` (the URL after "scheme://") names a store this
  // backend could open, without opening it (the settings' check at start):
  // INVALID_ARGUMENT saying what is wrong.
  Status (*check)(const std::string& location);
  // Opens the store `location` (the URL after "scheme://") names; `prefix`
  // gets its key prefix ("" or ending in '/'). INVALID_ARGUMENT for a
  // location the backend cannot hold.
  Status (*open)(const std::string& location, const StorageOptions& options, std::shared_ptr<ObjectStore>* out,
                 std::string* prefix);
};

// The backends, one line each.
const std::vector<StorageBackend>& StorageBackends();

// The backend of `url`'s scheme, or null (then `error` says why).
const StorageBackend* BackendOf(const std::string& url, std::string* location, Status* error);

// Opens the store `url` ("s3://bucket[/prefix]", "file:///dir") names;
// `prefix` gets the key prefix ("" or "run1/"). INVALID_ARGUMENT for an
// unknown scheme or a location its backend refuses.
Status OpenObjectStore(const std::string& url, const StorageOptions& options, std::shared_ptr<ObjectStore>* out,
                       std::string* prefix);

// Opens the stores of `objects` (dir, url) into `out`.
Status OpenObjectRoots(const std::vector<std::pair<std::string, std::string>>& objects,
                       const StorageOptions& options, std::shared_ptr<ObjectRoots>* out);

}  // namespace tce
