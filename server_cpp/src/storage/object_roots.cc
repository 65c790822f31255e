#include "storage/object_roots.h"

#include <sstream>

#include "storage/backends.h"

namespace tce {
namespace {

std::string Trim(const std::string& s) {
  const size_t b = s.find_first_not_of(" \t");
  if (b == std::string::npos) return "";
  return s.substr(b, s.find_last_not_of(" \t") - b + 1);
}

std::string NormalDir(std::string dir) {
  while (dir.size() > 1 && dir.back() == '/') dir.pop_back();
  return dir;
}

// "s3, gcs": the schemes of object roots, for messages.
std::string ObjectSchemes() {
  std::string out;
  for (const StorageBackend& b : StorageBackends())
    if (std::string(b.scheme) != "file") out += (out.empty() ? "" : ", ") + std::string(b.scheme) + "://";
  return out;
}

}  // namespace

Status ParseStorageRoots(const std::string& text, std::vector<std::string>* dirs,
                         std::vector<std::pair<std::string, std::string>>* objects) {
  dirs->clear();
  objects->clear();
  std::stringstream ss(text);
  std::string part;
  while (std::getline(ss, part, ',')) {
    part = Trim(part);
    if (part.empty()) continue;
    const size_t eq = part.find('=');
    std::string dir = NormalDir(Trim(part.substr(0, eq)));
    if (dir.empty() || dir[0] != '/') return Status::InvalidArgument("storage root must be absolute: " + part);
    if (eq == std::string::npos) {
      dirs->push_back(dir);
      continue;
    }
    if (dir == "/") return Status::InvalidArgument("an object storage root cannot be '/': " + part);
    const std::string url = Trim(part.substr(eq + 1));
    std::string location;
    Status s;
    const StorageBackend* backend = BackendOf(url, &location, &s);
    if (backend && std::string(backend->scheme) == "file") backend = nullptr;  // a directory root is DIR alone
    if (!backend) {
      if (!s.ok() && url.find("://") == std::string::npos) return s;
      return Status::InvalidArgument("storage root " + dir + ": unknown scheme '" + url.substr(0, url.find("://")) +
                                     "' (want " + ObjectSchemes() + ")");
    }
    if (Status c = backend->check(location); !c.ok())
      return Status::InvalidArgument("'" + url + "': " + c.message());
    objects->emplace_back(dir, url);
  }
  for (const auto& [dir, url] : *objects)
    for (const std::string& other : *dirs)
      if (other == dir) return Status::InvalidArgument(dir + " is both a directory root and " + url);
  return Status::OK();
}

void ObjectRoots::AbandonUnfinishedInBackground() {
  if (abandoning_.joinable()) return;
  std::vector<std::shared_ptr<ObjectStore>> stores;
  for (const ObjectRoot& r : roots_) stores.push_back(r.store);
  abandoning_ = std::thread([stores] {
    for (const auto& s : stores) s->AbandonUnfinished();
  });
}

void ObjectRoots::CancelAll() {
  for (const ObjectRoot& r : roots_) r.store->Cancel();
  if (abandoning_.joinable()) abandoning_.join();
}

bool IsTagMarker(const std::string& path) {
  const std::string name = path.substr(path.rfind('/') + 1);
  return name == ".metadata" || name == "latest";
}

const ObjectRoot* ObjectRoots::Find(const std::string& path, std::string* key) const {
  const ObjectRoot* best = nullptr;
  for (const ObjectRoot& r : roots_) {
    if (path.size() <= r.dir.size() + 1 || path.compare(0, r.dir.size(), r.dir) != 0 || path[r.dir.size()] != '/')
      continue;
    if (!best || r.dir.size() > best->dir.size()) best = &r;
  }
  if (best && key) *key = best->prefix + path.substr(best->dir.size() + 1);
  return best;
}

}  // namespace tce
