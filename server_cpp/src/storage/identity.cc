#include "storage/identity.h"

namespace tce {
namespace {

StorageCheck Changed(std::string why) { return {Verdict::kChanged, std::move(why)}; }
StorageCheck Unavailable(std::string why) { return {Verdict::kUnavailable, std::move(why)}; }

}  // namespace

std::string Dirname(const std::string& path) {
  size_t slash = path.rfind('/');
  return slash == 0 || slash == std::string::npos ? "/" : path.substr(0, slash);
}

const std::string* RootOf(const std::string& resolved, const std::vector<std::string>& roots) {
  const std::string* best = nullptr;
  for (const std::string& r : roots) {
    const bool under = r == "/" || resolved == r ||
                       (resolved.size() > r.size() && resolved.compare(0, r.size(), r) == 0 &&
                        resolved[r.size()] == '/');
    if (under && (!best || r.size() > best->size())) best = &r;
  }
  return best;
}

StorageCheck ClassifyOpenFailure(Env* env, const std::string& dir, const Status& error,
                                 const DiskIdentity& expected) {
  // Env::OpenDirectory and OpenResolved refuse a path that a symlink (or a
  // file) now redirects with PERMISSION_DENIED and these words; any other
  // refusal (EACCES, as on an NFS export that squashes root) says nothing
  // about what the path holds.
  const std::string& m = error.message();
  if (error.code() == Status::Code::kPermissionDenied &&
      (m.find("is a symlink or not a directory") != std::string::npos ||
       m.find("not under a storage root") != std::string::npos))
    return Changed(dir + " is no longer the directory the file was saved in: " + m);
  if (error.code() != Status::Code::kNotFound) return Unavailable(error.ToString());
  // Missing: removed, or its filesystem is gone? Ask the nearest ancestor.
  for (std::string at = Dirname(dir);; at = Dirname(at)) {
    FileStat st;
    Status s = env->Stat(at, &st);
    if (s.ok()) {
      if (st.dev == expected.dir_dev) return Changed("directory " + dir + " was removed");
      return Unavailable(dir + " is missing and " + at +
                         " is on another filesystem than it was: storage is not mounted");
    }
    if (s.code() != Status::Code::kNotFound) return Unavailable(s.ToString());
    if (at == "/") return Unavailable(dir + " is missing");
  }
}

StorageCheck CheckDirectory(Directory* dir, const std::string& path, const DiskIdentity& expected) {
  FileStat st;
  Status s = dir->Stat(&st);
  if (!s.ok()) return Unavailable(s.ToString());
  if (st.dev != expected.dir_dev)
    return Unavailable("the directory of " + path + " is on another filesystem than it was");
  if (st.ino != expected.dir_ino)
    return Changed("the directory of " + path + " was removed and made again");
  if (st.nlink == 0) return Changed("the directory of " + path + " was removed");
  return {};
}

StorageCheck CheckEntry(Directory* dir, const std::string& path, const std::string& name,
                        const DiskIdentity& expected, FileStat* now, bool* exists) {
  Status s = dir->StatAt(name, now);
  *exists = s.ok();
  if (s.code() == Status::Code::kNotFound)
    return expected.exists ? Changed(path + " was deleted on storage") : StorageCheck();
  if (!s.ok()) return Unavailable(s.ToString());
  if (!expected.exists) return Changed("another file was written at " + path);
  if (now->dev != expected.dev || now->ino != expected.ino)
    return Changed(path + " was replaced on storage");
  if (now->size != expected.size || now->mtime_ns != expected.mtime_ns)
    return Changed(path + " was modified on storage");
  return {};
}

bool SameStoredFile(const DiskIdentity& was, const DiskIdentity& now) {
  if (!was.known || !was.exists || !was.written || was.size != now.size) return false;
  if (!was.etag.empty() || !now.etag.empty()) return was.etag == now.etag;
  return was.ino == now.ino && was.mtime_ns == now.mtime_ns && (was.dev == 0 || was.dev == now.dev);
}

DiskIdentity FileIn(const DiskIdentity& dir, const FileStat& st) {
  DiskIdentity d = dir;  // the same directory
  if (!dir.known) return d;  // a recovered file: its directory was never seen
  d.exists = true;
  d.written = true;
  d.dev = st.dev;
  d.ino = st.ino;
  d.size = st.size;
  d.mtime_ns = st.mtime_ns;
  d.mode = st.mode & 07777;
  d.etag = st.etag;
  return d;
}

DiskIdentity IdentityOf(const ObjectId& o) {
  DiskIdentity d;
  d.known = true;
  d.exists = o.exists;
  d.size = o.exists ? o.size : 0;
  d.etag = o.exists ? o.etag : "";
  return d;
}

StorageCheck CompareObject(const std::string& url, const DiskIdentity& expected, const ObjectId& now) {
  if (!expected.exists && !now.exists) return {};
  if (expected.exists && !now.exists) return {Verdict::kChanged, url + " was deleted from object storage"};
  if (!expected.exists) return {Verdict::kChanged, url + " was created on object storage by another writer"};
  if (now.size != expected.size || now.etag != expected.etag)
    return {Verdict::kChanged, url + " was replaced on object storage (ETag " + now.etag + ", " +
                                   std::to_string(now.size) + " bytes; expected " + expected.etag + ", " +
                                   std::to_string(expected.size) + ")"};
  return {};
}

}  // namespace tce
