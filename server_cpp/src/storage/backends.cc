#include "storage/backends.h"

namespace tce {

const std::vector<StorageBackend>& StorageBackends() {
  static const std::vector<StorageBackend> kBackends = {
      {"file", &PosixStore::CheckLocation,
       [](const std::string& location, const StorageOptions& o, std::shared_ptr<ObjectStore>* out,
          std::string* prefix) { return PosixStore::Open(location, o.file, out, prefix); }},
      {"s3", &S3Store::CheckLocation,
       [](const std::string& location, const StorageOptions& o, std::shared_ptr<ObjectStore>* out,
          std::string* prefix) { return S3Store::Open(location, o.s3, out, prefix); }},
  };
  return kBackends;
}

const StorageBackend* BackendOf(const std::string& url, std::string* location, Status* error) {
  const size_t sep = url.find("://");
  if (sep == std::string::npos || sep == 0) {
    *error = Status::InvalidArgument("'" + url + "' is not a URL (want SCHEME://LOCATION, e.g. s3://BUCKET[/PREFIX])");
    return nullptr;
  }
  const std::string scheme = url.substr(0, sep);
  for (const StorageBackend& b : StorageBackends()) {
    if (scheme != b.scheme) continue;
    *location = url.substr(sep + 3);
    *error = Status::OK();
    return &b;
  }
  *error = Status::InvalidArgument("unknown object storage scheme '" + scheme + "' in " + url);
  return nullptr;
}

Status OpenObjectStore(const std::string& url, const StorageOptions& options, std::shared_ptr<ObjectStore>* out,
                       std::string* prefix) {
  std::string location;
  Status s;
  const StorageBackend* backend = BackendOf(url, &location, &s);
  if (!backend) return s;
  if (s = backend->check(location); !s.ok()) return Status::InvalidArgument("'" + url + "': " + s.message());
  return backend->open(location, options, out, prefix);
}

Status OpenObjectRoots(const std::vector<std::pair<std::string, std::string>>& objects,
                       const StorageOptions& options, std::shared_ptr<ObjectRoots>* out) {
  auto roots = std::make_shared<ObjectRoots>();
  for (const auto& [dir, url] : objects) {
    ObjectRoot r;
    r.dir = dir;
    r.url = url;
    Status s = OpenObjectStore(url, options, &r.store, &r.prefix);
    if (!s.ok()) return Status::FromCode(s.code(), dir + "=" + url + ": " + s.message());
    roots->Add(std::move(r));
  }
  *out = roots;
  return Status::OK();
}

}  // namespace tce
