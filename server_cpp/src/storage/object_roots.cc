#include <cctype>
#include <sstream>

#include "storage/object_store.h"
#include "storage/posix_store.h"
#include "storage/s3_store.h"

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

// A bucket name as S3 allows it (3-63 of a-z 0-9 . -), so it can go into a
// host name or a path unescaped.
bool ValidBucket(const std::string& b) {
  if (b.size() < 3 || b.size() > 63) return false;
  for (char c : b)
    if (!((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '.' || c == '-')) return false;
  return b.front() != '.' && b.front() != '-' && b.back() != '.' && b.back() != '-';
}

// "s3://bucket/a/b" -> scheme "s3", bucket "bucket", prefix "a/b/".
Status SplitUrl(const std::string& url, std::string* scheme, std::string* bucket, std::string* prefix) {
  const size_t sep = url.find("://");
  if (sep == std::string::npos || sep == 0)
    return Status::InvalidArgument("'" + url + "' is not a URL (want s3://BUCKET[/PREFIX])");
  *scheme = url.substr(0, sep);
  std::string rest = url.substr(sep + 3);
  const size_t slash = rest.find('/');
  *bucket = rest.substr(0, slash);
  std::string p = slash == std::string::npos ? "" : rest.substr(slash + 1);
  while (!p.empty() && p.back() == '/') p.pop_back();
  for (char c : p)
    if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f || c == '\\')
      return Status::InvalidArgument("the key prefix of '" + url + "' has a control character or '\\'");
  if (p.find("//") != std::string::npos || p == "." || p.find("./") == 0 || p.find("/./") != std::string::npos ||
      p.find("..") != std::string::npos)
    return Status::InvalidArgument("the key prefix of '" + url + "' has an empty, '.' or '..' component");
  *prefix = p.empty() ? "" : p + "/";
  if (!ValidBucket(*bucket))
    return Status::InvalidArgument("'" + *bucket + "' in '" + url +
                                   "' is not a bucket name (3-63 of a-z, 0-9, '.', '-')");
  return Status::OK();
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
    std::string scheme, bucket, prefix;
    if (Status s = SplitUrl(url, &scheme, &bucket, &prefix); !s.ok()) return s;
    if (scheme != "s3")
      return Status::InvalidArgument("storage root " + dir + ": unknown scheme '" + scheme + "' (want s3://)");
    objects->emplace_back(dir, url);
  }
  for (const auto& [dir, url] : *objects)
    for (const std::string& other : *dirs)
      if (other == dir) return Status::InvalidArgument(dir + " is both a directory root and " + url);
  return Status::OK();
}

Status OpenObjectStore(const std::string& url, const ObjectStoreOptions& options,
                       std::shared_ptr<ObjectStore>* out, std::string* prefix) {
  if (url.compare(0, 7, "file://") == 0) {  // a directory root: file:///abs/dir
    const std::string dir = NormalDir(url.substr(7));
    if (dir.empty() || dir[0] != '/' || (dir + "/").find("/../") != std::string::npos || !options.env)
      return Status::InvalidArgument("'" + url + "' is not a directory root (want file:///ABSOLUTE/DIR)");
    prefix->clear();
    *out = std::make_shared<PosixStore>(dir, options);
    return Status::OK();
  }
  std::string scheme, bucket;
  if (Status s = SplitUrl(url, &scheme, &bucket, prefix); !s.ok()) return s;
  if (scheme == "s3") return S3Store::Open(bucket, options, out);
  return Status::InvalidArgument("unknown object storage scheme '" + scheme + "' in " + url);
}

Status OpenObjectRoots(const std::vector<std::pair<std::string, std::string>>& objects,
                       const ObjectStoreOptions& options, std::shared_ptr<ObjectRoots>* out) {
  auto roots = std::make_shared<ObjectRoots>();
  for (const auto& [dir, url] : objects) {
    ObjectStoreOptions o = options;
    if (!o.journal.empty()) {  // a file named after the URL: the same store finds it after a restart
      std::string name;
      for (char c : url) name += std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '.' ? c : '_';
      o.journal += "/uploads-" + name.substr(0, 200) + ".journal";
    }
    ObjectRoot r;
    r.dir = dir;
    r.url = url;
    Status s = OpenObjectStore(url, o, &r.store, &r.prefix);
    if (!s.ok()) return Status::FromCode(s.code(), dir + "=" + url + ": " + s.message());
    roots->Add(std::move(r));
  }
  *out = roots;
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
