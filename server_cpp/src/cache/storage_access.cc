// StorageAccess: storage read into the cache for loads that missed and for
// the ring's cooperative restore, and object storage as clients see it.
#include "cache/storage_access.h"

#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <utility>

#include "common/logging.h"
#include "env/fs_identity.h"

namespace tce {
namespace {
// A file is read into a buffer this much at a time: small enough to stay in
// the CPU's cache between the read and the write into the buffer.
constexpr size_t kFillPiece = 256 << 10;
}  // namespace

StorageAccess::StorageAccess(std::shared_ptr<const StorageRoots> storage, StorageAccessOptions options,
                             Clock* clock, StorageAccessHost* host)
    : storage_(std::move(storage)), fetch_files_(options.fetch_files), clock_(clock), host_(host) {}

bool StorageAccess::IsObjectPath(const std::string& path) const {
  return storage_->ObjectRootOf(path, nullptr) != nullptr;
}

bool StorageAccess::UnderStorage(const std::string& path) {
  if (storage_->ObjectRootOf(path, nullptr)) return true;
  return storage_->has_dirs() && storage_->CheckUnder(path).ok();
}

bool StorageAccess::FetchesOnMiss(const std::string& path) {
  if (storage_->ObjectRootOf(path, nullptr)) return true;
  return fetch_files_ && UnderStorage(path);
}

Status StorageAccess::FetchFromStorage(const std::string& session, const std::string& job, const std::string& path) {
  // Whether the path lies under a root is the caller's question
  // (FetchesOnMiss); the read itself opens nothing outside one (OpenAsUser).
  if (!fetch_files_ && !storage_->ObjectRootOf(path, nullptr))
    return Status::NotFound(path + " is not read from storage by this server");
  StorageAccessHost::Caller who;
  Status s = host_->Authorize(session, job, "load " + path + " into job '" + job + "'", /*claim=*/true, &who);
  if (!s.ok()) return s;
  bool read_here = false;
  s = FetchStored(job, path, who.uid, who.gid, /*for_peer=*/false, &read_here);
  // Read by another load, or here already: this load's bytes come from the cache.
  return s.ok() && !read_here ? Status::FailedPrecondition(path + " reached the cache meanwhile") : s;
}

std::vector<JobLoadSplit> StorageAccess::LoadSplits(bool admin, uid_t uid) {
  std::vector<JobLoadSplit> all = loads_.All();
  if (admin) return all;
  std::vector<JobLoadSplit> mine;
  for (JobLoadSplit& j : all) {
    uid_t owner = 0;
    if (host_->JobUid(j.job, &owner) && owner == uid) mine.push_back(std::move(j));
  }
  return mine;
}

std::string StorageAccess::ClaimRead(const std::string& job, const std::string& path, const std::string& node) {
  constexpr size_t kMaxClaims = 65536;
  constexpr auto kClaimFor = std::chrono::minutes(10);
  MutexLock lock(&claims_mu_);
  const Clock::TimePoint now = clock_->Now();
  auto it = read_claims_.find({job, path});
  if (it != read_claims_.end() && now - it->second.at < kClaimFor) return it->second.node;
  if (read_claims_.size() >= kMaxClaims) read_claims_.clear();  // forgetting one costs at most a read
  read_claims_[{job, path}] = {node, now};
  return node;
}

size_t StorageAccess::DropClaims(const std::string& job, const std::string& node) {
  MutexLock lock(&claims_mu_);
  size_t n = 0;
  for (auto it = read_claims_.begin(); it != read_claims_.end();) {
    if (it->first.first == job && it->second.node == node) {
      it = read_claims_.erase(it);
      ++n;
    } else {
      ++it;
    }
  }
  return n;
}

Status StorageAccess::LoadFromStorage(const std::string& job, const std::string& path, bool for_peer) {
  uid_t uid = 0;
  gid_t gid = 0;
  Status s = host_->JobOwnerIds(job, &uid, &gid);
  return s.ok() ? FetchStored(job, path, uid, gid, for_peer) : s;
}

const ObjectRoot* StorageAccess::ObjectDir(const std::string& dir, std::string* prefix) const {
  const ObjectRoot* root = storage_->ObjectRootOf(dir + "/x", prefix);  // the key of a file "x" in `dir`
  if (root) prefix->pop_back();
  return root;
}

Status StorageAccess::ListStorageDir(const std::string& job, const std::string& dir, std::vector<ListedObject>* out) {
  out->clear();
  std::string prefix;
  if (const ObjectRoot* root = ObjectDir(dir, &prefix)) {
    std::vector<ListedObject> listed;  // the job's owner's (and unowned) objects
    Status s = root->store->List(prefix, host_->JobRequester(job), &listed);
    if (!s.ok()) return s;
    for (const ListedObject& o : listed) {
      if (o.key.compare(0, root->prefix.size(), root->prefix) != 0) continue;
      const std::string path = root->dir + "/" + o.key.substr(root->prefix.size());
      if (Dirname(path) == dir) out->push_back({path, o.size});  // not a directory below
    }
    return Status::OK();
  }
  uid_t uid = 0;
  gid_t gid = 0;
  Status s = host_->JobOwnerIds(job, &uid, &gid);
  std::unique_ptr<Directory> d;
  if (s.ok()) s = OpenAsUser(dir, uid, gid, &d);
  std::vector<std::pair<std::string, FileStat>> entries;
  if (s.ok()) {
    FsIdentity as_user(uid, gid);
    s = d->List(&entries);
  }
  if (!s.ok()) return s;
  for (const auto& [name, st] : entries)
    if (S_ISREG(st.mode)) out->push_back({dir + "/" + name, st.size});
  return Status::OK();
}

// ---- reads into the cache ----

Status StorageAccess::FetchStored(const std::string& job, const std::string& path, uid_t uid, gid_t gid,
                                  bool for_peer, bool* read_here) {
  // One read per node: a load that misses while another one reads the same
  // file waits for that read and shares its outcome.
  bool shared = false;
  return fetching_.Do({job, path}, [&] {
    if (host_->InMemory(job, path)) return Status::OK();  // here already
    std::string key;
    uint64_t size = 0;
    const ObjectRoot* root = storage_->ObjectRootOf(path, &key);
    Status r = root ? FetchObjectOnce(*root, key, job, path, uid, gid, &size) : FetchFileOnce(job, path, uid, gid, &size);
    if (r.ok()) loads_.Note(job, LoadFrom::kStorage, size, for_peer);
    if (r.ok() && read_here) *read_here = true;  // only the call that reads runs this
    return r;
  }, &shared, [this] { ++fetches_shared_; });
}

Status StorageAccess::FetchObjectOnce(const ObjectRoot& root, const std::string& key, const std::string& job,
                                      const std::string& path, uid_t uid, gid_t gid, uint64_t* size) {
  ObjectId obj;
  const Requester who = host_->RequesterOf(uid);  // another uid's object is not read for this one
  Status s = root.store->Stat(key, &obj);
  if (s.ok() && !obj.exists) return Status::NotFound(root.store->Url(key) + " does not exist");
  if (s.ok()) s = MayUse(who, obj, root.store->Url(key), "read");
  if (!s.ok()) return s;
  std::unique_ptr<Buffer> mem;
  double secs = 0;
  s = ReadIntoBuffer(obj.size, path,
                     [&](char* into) { return root.store->Read(key, 0, obj.size, into, obj.etag, who); }, &mem, &secs);
  if (!s.ok()) return s;
  DiskIdentity disk = IdentityOf(obj);
  disk.written = true;
  *size = obj.size;
  return host_->InstallFetched(job, path, std::move(mem), obj.size, uid, gid, disk, root.store->Url(key), secs);
}

Status StorageAccess::FetchFileOnce(const std::string& job, const std::string& path, uid_t uid, gid_t gid,
                                    uint64_t* size) {
  // As the job's user: the kernel checks that user's permissions on every
  // directory on the way and on the file, as its own read would (the
  // buffer is made as the server).
  std::unique_ptr<Directory> d;
  FileStat dst, st;
  const std::string name = path.substr(path.rfind('/') + 1);
  Status s = OpenAsUser(Dirname(path), uid, gid, &d);
  if (s.ok()) s = d->Stat(&dst);
  if (s.ok()) {
    FsIdentity as_user(uid, gid);
    s = d->StatAt(name, &st);
  }
  if (s.code() == Status::Code::kNotFound) return Status::NotFound("No such file or directory: " + path);
  if (s.ok() && !S_ISREG(st.mode)) s = Status::FailedPrecondition(path + " is not a regular file");
  if (!s.ok()) return s;
  std::unique_ptr<Buffer> mem;
  double secs = 0;
  FileStat parent;
  s = FillBuffer(st.size, path, [&](const Directory::Sink& into) {
    FsIdentity as_user(uid, gid);
    if (!as_user.ok(uid)) return Status::PermissionDenied("cannot read storage as uid " + std::to_string(uid));
    Status r = d->ReadPieces(name, 0, st.size, kFillPiece, into);
    // A file rewritten in place while it was read is no file at all.
    FileStat after;
    if (r.ok() && (r = d->StatAt(name, &after)).ok() &&
        (after.ino != st.ino || after.size != st.size || after.mtime_ns != st.mtime_ns))
      r = Status::Unavailable(path + " changed on storage while it was read");
    if (r.ok() && !d->StatParent(&parent).ok()) parent.ino = 0;
    return r;
  }, &mem, &secs);
  if (!s.ok()) return s;
  DiskIdentity dir;  // the directory it was read from; FileIn adds the file
  dir.known = true;
  dir.dir_dev = dst.dev;
  dir.dir_ino = dst.ino;
  dir.parent_ino = parent.ino;
  *size = st.size;
  return host_->InstallFetched(job, path, std::move(mem), st.size, uid, gid, FileIn(dir, st), path, secs);
}

Status StorageAccess::OpenAsUser(const std::string& dir, uid_t uid, gid_t gid, std::unique_ptr<Directory>* d) {
  FsIdentity as_user(uid, gid);
  if (!as_user.ok(uid)) return Status::PermissionDenied("cannot read storage as uid " + std::to_string(uid));
  return storage_->OpenDirectory(dir, d);
}

Status StorageAccess::ReadIntoBuffer(uint64_t size, const std::string& path,
                                     const std::function<Status(char*)>& read, std::unique_ptr<Buffer>* mem,
                                     double* secs) {
  Status s = host_->ReserveBuffer(size, mem);
  if (!s.ok()) return s;
  s = ReadThroughMapping(**mem, size, path, read, secs);
  if (!s.ok()) host_->ReturnBuffer(std::move(*mem));
  return s;
}

Status StorageAccess::FillBuffer(uint64_t size, const std::string& path,
                                 const std::function<Status(const Directory::Sink&)>& read,
                                 std::unique_ptr<Buffer>* mem, double* secs) {
  Status s = host_->ReserveBuffer(size, mem);
  if (!s.ok()) return s;
  auto inside = [&](uint64_t off, size_t n) {
    return off <= size && n <= size - off ? Status::OK()
                                          : Status::Internal("a piece of " + path + " lies beyond its size");
  };
  if ((*mem)->backing() == Backing::kHugetlb) {  // hugetlbfs has no write(2): through a mapping
    s = ReadThroughMapping(**mem, size, path, [&](char* into) {
      return read([&](uint64_t off, const char* data, size_t n) {
        Status in = inside(off, n);
        if (in.ok()) memcpy(into + off, data, n);
        return in;
      });
    }, secs);
  } else {
    int fd = -1;
    s = (*mem)->NewFd(/*writable=*/true, &fd);
    const Stopwatch took(clock_);
    if (s.ok()) {
      s = read([&](uint64_t off, const char* data, size_t n) {
        Status in = inside(off, n);
        return in.ok() ? Buffer::WriteAt(fd, off, data, n, "a buffer read from storage") : in;
      });
    }
    *secs = took.Seconds();
    if (fd >= 0) ::close(fd);
  }
  if (!s.ok()) host_->ReturnBuffer(std::move(*mem));
  return s;
}

Status StorageAccess::ReadThroughMapping(const Buffer& mem, uint64_t size, const std::string& path,
                                         const std::function<Status(char*)>& read, double* secs) {
  int fd = -1;
  void* map = MAP_FAILED;
  Status s = mem.NewFd(/*writable=*/true, &fd);
  if (s.ok() && size > 0) {
    map = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (map == MAP_FAILED) s = Status::FromErrno(errno, "mmap a buffer for " + path);
  }
  if (fd >= 0) ::close(fd);
  const Stopwatch took(clock_);
  if (s.ok() && size > 0) s = read(static_cast<char*>(map));
  *secs = took.Seconds();
  if (map != MAP_FAILED) munmap(map, size);
  return s;
}

// ---- object storage as clients see it ----

Status StorageAccess::ReadObjectRange(const std::string& session, const std::string& job, const std::string& path,
                                      uint64_t offset, uint64_t length, std::string* data, unsigned char* into,
                                      ObjectId* id) {
  std::string key;
  const ObjectRoot* root = storage_->ObjectRootOf(path, &key);
  if (!root) return Status::NotFound(path + " is not under an object storage root");
  StorageAccessHost::Caller caller;
  Status s = host_->Authorize(session, job, "read " + path + " of job '" + job + "'", /*claim=*/false, &caller);
  if (!s.ok()) return s;
  const Requester who = caller.requester;
  const std::string url = root->store->Url(key);
  // Pinned: the load saw this identity at its first range; no look now,
  // the read itself (If-Match) tells whether the object is still that one.
  const bool pinned = !id->etag.empty();
  ObjectId obj = *id;
  obj.exists = true;
  if (!pinned) {
    s = root->store->Stat(key, &obj);
    if (!s.ok()) return s;
    if (!obj.exists) return Status::NotFound(url + " does not exist");
    s = MayUse(who, obj, url, "read");
    if (!s.ok()) return s;
  }
  if (offset > obj.size || length > obj.size - offset)
    return Status::FromCode(Status::Code::kOutOfRange, "bytes " + std::to_string(offset) + "+" +
                                                           std::to_string(length) + " lie past the end of " + url +
                                                           " (" + std::to_string(obj.size) + " bytes)");
  if (length > 0) {
    if (!into) {
      data->resize(length);
      into = reinterpret_cast<unsigned char*>(&(*data)[0]);
    }
    s = root->store->Read(key, offset, length, reinterpret_cast<char*>(into), obj.etag, who);  // owner checked again
  }
  if (pinned && (s.code() == Status::Code::kFailedPrecondition || s.code() == Status::Code::kNotFound ||
                 s.code() == Status::Code::kOutOfRange)) {
    // 412 (another ETag), 404 (deleted), or a range the object no longer
    // has: not the object this load began reading.
    return Status::FailedPrecondition(url + " was " + (s.code() == Status::Code::kNotFound ? "deleted" : "replaced") +
                                      " on object storage since this load began (it read ETag " + obj.etag + ", " +
                                      std::to_string(obj.size) + " bytes): " + s.message());
  }
  if (!s.ok()) return s;
  *id = obj;
  if (length > 0) ++ranges_read_;
  return Status::OK();
}

Status StorageAccess::DeleteObject(const std::string& session, const std::string& job, const std::string& path) {
  std::string key;
  const ObjectRoot* root = storage_->ObjectRootOf(path, &key);
  if (!root) return Status::InvalidArgument(path + " is not under an object storage root");
  StorageAccessHost::Caller caller;
  Status s = host_->Authorize(session, job, "delete " + path + " of job '" + job + "'", /*claim=*/false, &caller);
  if (!s.ok()) return s;
  s = root->store->Delete(key, caller.requester);
  if (s.ok()) TCE_LOG(kInfo, "cache") << "deleted " << root->store->Url(key) << " (job=" << job << ")";
  return s;
}

Status StorageAccess::ListStored(const std::string& session, const std::string& job, const std::string& dir,
                                 std::vector<FileInfo>* out) {
  out->clear();
  std::string prefix;
  const ObjectRoot* root = ObjectDir(dir, &prefix);
  if (!root) return Status::InvalidArgument(dir + " is not under an object storage root");
  StorageAccessHost::Caller caller;
  Status s = host_->Authorize(session, job, "list " + dir + " for job '" + job + "'", /*claim=*/false, &caller);
  if (!s.ok()) return s;
  std::vector<ListedObject> listed;  // another uid's objects left out
  s = root->store->List(prefix, caller.requester, &listed);
  if (!s.ok()) return s;
  for (const ListedObject& o : listed) {
    if (o.key.compare(0, root->prefix.size(), root->prefix) != 0) continue;
    FileInfo f;
    f.job = job;
    f.path = root->dir + "/" + o.key.substr(root->prefix.size());
    f.size = o.size;
    f.state = FileState::kPersisted;
    out->push_back(std::move(f));
  }
  return Status::OK();
}

}  // namespace tce
