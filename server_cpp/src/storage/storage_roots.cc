#include "storage/storage_roots.h"

#include <sys/stat.h>

#include <utility>

#include "storage/identity.h"

namespace tce {
namespace {

// `resolved` (under `root`) below the root: "" for the root itself.
std::string Below(const std::string& root, const std::string& resolved) {
  const size_t skip = root == "/" ? 1 : root.size() + 1;
  return resolved.size() > skip ? resolved.substr(skip) : "";
}

}  // namespace

Status StorageRoots::Open(const std::string& setting, const StorageOptions& options,
                          std::shared_ptr<StorageRoots>* out) {
  std::vector<std::string> dirs;
  std::vector<std::pair<std::string, std::string>> urls;
  Status s = ParseStorageRoots(setting, &dirs, &urls);
  if (!s.ok()) return s;
  Env* env = options.file.env ? options.file.env : Env::Default();
  for (const std::string& dir : dirs) {  // a root may be a symlink to its directory
    std::string resolved;
    FileStat st;
    s = env->ResolvePath(dir, &resolved);
    if (s.ok()) s = env->Stat(resolved, &st);
    if (s.code() == Status::Code::kNotFound || (s.ok() && !S_ISDIR(st.mode)))
      return Status::NotFound(dir + (s.ok() ? " is not a directory" : " does not exist") +
                              ": the server never creates a storage root (mount or create it first, or leave it out)");
    if (!s.ok()) return Status::InvalidArgument(dir + ": " + s.ToString());
  }
  std::shared_ptr<ObjectRoots> objects;
  if (!urls.empty() && !(s = OpenObjectRoots(urls, options, &objects)).ok()) return s;
  *out = std::make_shared<StorageRoots>(dirs, std::move(objects), options.file);
  return Status::OK();
}

StorageRoots::StorageRoots(const std::vector<std::string>& dirs, std::shared_ptr<ObjectRoots> objects,
                           PosixStoreOptions file)
    : env_(file.env ? file.env : Env::Default()),
      objects_(objects ? std::move(objects) : std::make_shared<ObjectRoots>()) {
  file.env = env_;
  for (const std::string& dir : dirs) {
    std::string resolved;
    dirs_.push_back(env_->ResolvePath(dir, &resolved).ok() ? resolved : dir);
    configured_.push_back(dir);
    dir_stores_.push_back(std::make_shared<PosixStore>(dirs_.back(), file));
  }
}

std::string StorageRoots::Describe() const {
  std::string out;
  for (const std::string& dir : dirs_) out += (out.empty() ? "" : ", ") + dir;
  for (const ObjectRoot& o : objects_->all()) out += (out.empty() ? "" : ", ") + o.dir + "=" + o.url;
  return out;
}

int StorageRoots::DirRootOf(const std::string& resolved) const {
  const std::string* root = RootOf(resolved, dirs_);
  return root ? static_cast<int>(root - dirs_.data()) : -1;
}

std::string StorageRoots::RootName(const std::string& path) const {
  if (const ObjectRoot* root = objects_->Find(path, nullptr)) return root->dir;
  const std::string* resolved = RootOf(path, dirs_);
  const std::string* configured = RootOf(path, configured_);
  if (configured && (!resolved || configured->size() > resolved->size()))
    return dirs_[configured - configured_.data()];
  return resolved ? *resolved : "";
}

const ObjectRoot* StorageRoots::ObjectRootOf(const std::string& path, std::string* key) const {
  return objects_->Find(path, key);
}

Status StorageRoots::Locate(const std::string& path, Location* out) const {
  *out = Location();
  if (const ObjectRoot* root = objects_->Find(path, &out->key)) {
    out->store = root->store.get();
    out->object = root;
    return Status::OK();
  }
  const std::string dir = Dirname(path);
  Status s = env_->ResolvePath(dir, &out->dir);
  if (!s.ok()) return s;
  const int i = DirRootOf(out->dir);
  if (i < 0)
    return Status::PermissionDenied(dir + " resolves to " + out->dir + ", which is not under a storage root");
  out->store = dir_stores_[i].get();
  out->root = dirs_[i];
  const std::string below = Below(out->root, out->dir);
  out->key = (below.empty() ? "" : below + "/") + path.substr(path.rfind('/') + 1);
  return Status::OK();
}

Status StorageRoots::CheckUnder(const std::string& path) const {
  if (empty()) return Status::OK();
  std::string key;
  if (const ObjectRoot* root = objects_->Find(path, &key)) {
    Status s = root->store->CheckKey(key);
    return s.ok() ? s : Status::InvalidArgument("path: " + path + ": " + s.message());
  }
  std::string resolved;
  Status s = env_->ResolvePath(path, &resolved);
  if (!s.ok()) return Status::PermissionDenied("cannot resolve " + path + ": " + s.message());
  if (DirRootOf(resolved) >= 0) return Status::OK();
  return Status::PermissionDenied(path + (resolved != path ? " (resolves to " + resolved + ")" : "") +
                                  " is not under a storage root (" + Describe() + ")");
}

Status StorageRoots::OpenDirectory(const std::string& dir, std::unique_ptr<Directory>* out,
                                   std::string* resolved) const {
  std::string r;
  Status s = env_->ResolvePath(dir, &r);
  if (resolved) *resolved = r;
  if (!s.ok()) return s;
  const int i = DirRootOf(r);
  if (i < 0) return Status::PermissionDenied(dir + " resolves to " + r + ", which is not under a storage root");
  return dir_stores_[i]->OpenDirectory(Below(dirs_[i], r), /*create=*/false, out);
}

}  // namespace tce
