// Cache: a load that misses memory and the ring brings the file from storage
// into the cache: an object root's object, or a directory root's file, read
// as the job's user. One read per file at a time, however many loads ask
// (ranks of this node, or other nodes whose restore plan names this one:
// docs/ring.md), so a restore reads each byte of storage once per cluster.
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "cache/cache.h"
#include "common/logging.h"
#include "env/fs_identity.h"

namespace tce {
namespace {
// A file is read into a buffer this much at a time: small enough to stay in
// the CPU's cache between the read and the write into the buffer.
constexpr size_t kFillPiece = 256 << 10;
}  // namespace

bool Cache::FetchesOnMiss(const std::string& path) {
  if (storage_->ObjectRootOf(path, nullptr)) return true;
  return fetch_files_ && UnderStorage(path);
}

Status Cache::FetchFromStorage(const std::string& session, const std::string& job, const std::string& path) {
  // Whether the path lies under a root is the caller's question
  // (FetchesOnMiss); the read itself opens nothing outside one (OpenAsUser).
  if (!fetch_files_ && !storage_->ObjectRootOf(path, nullptr))
    return Status::NotFound(path + " is not read from storage by this server");
  uid_t uid = 0;
  gid_t gid = 0;
  Status s = CallerIds(session, &uid, &gid);
  if (!s.ok()) return s;
  {
    MutexLock lock(&mu_);
    s = CheckAccess(session, job, "load " + path + " into job '" + job + "'", /*claim=*/true);
    if (!s.ok()) return s;
  }
  bool read_here = false;
  s = FetchStored(job, path, uid, gid, /*for_peer=*/false, &read_here);
  // Read by another load, or here already: this load's bytes come from the cache.
  return s.ok() && !read_here ? Status::FailedPrecondition(path + " reached the cache meanwhile") : s;
}

std::vector<JobLoadSplit> Cache::LoadSplits(bool admin, uid_t uid) {
  std::vector<JobLoadSplit> all = loads_.All();
  if (admin) return all;
  std::vector<JobLoadSplit> mine;
  MutexLock lock(&mu_);
  for (JobLoadSplit& j : all) {
    uid_t owner = 0;
    if (JobUidLocked(j.job, &owner) && owner == uid) mine.push_back(std::move(j));
  }
  return mine;
}

std::string Cache::ClaimRead(const std::string& job, const std::string& path, const std::string& node) {
  constexpr size_t kMaxClaims = 65536;
  constexpr auto kClaimFor = std::chrono::minutes(10);
  MutexLock lock(&mu_);
  const Clock::TimePoint now = clock_->Now();
  auto it = read_claims_.find({job, path});
  if (it != read_claims_.end() && now - it->second.at < kClaimFor) return it->second.node;
  if (read_claims_.size() >= kMaxClaims) read_claims_.clear();  // forgetting one costs at most a read
  read_claims_[{job, path}] = {node, now};
  return node;
}

size_t Cache::DropClaims(const std::string& job, const std::string& node) {
  MutexLock lock(&mu_);
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

bool Cache::UnderStorage(const std::string& path) {
  if (storage_->ObjectRootOf(path, nullptr)) return true;
  return storage_->has_dirs() && storage_->CheckUnder(path).ok();
}

Status Cache::LoadFromStorage(const std::string& job, const std::string& path, bool for_peer) {
  uid_t uid = 0;
  gid_t gid = 0;
  Status s = JobOwnerIds(job, &uid, &gid);
  return s.ok() ? FetchStored(job, path, uid, gid, for_peer) : s;
}

Status Cache::ListStorageDir(const std::string& job, const std::string& dir, std::vector<ListedObject>* out) {
  out->clear();
  std::string key;  // the key a file in `dir` named "x" would have: its prefix is dir's
  if (const ObjectRoot* root = storage_->ObjectRootOf(dir + "/x", &key)) {
    std::vector<ListedObject> listed;  // the job's owner's (and unowned) objects
    Status s = root->store->List(key.substr(0, key.size() - 1), JobRequester(job), &listed);
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
  Status s = JobOwnerIds(job, &uid, &gid);
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

Status Cache::FetchStored(const std::string& job, const std::string& path, uid_t uid, gid_t gid, bool for_peer,
                          bool* read_here) {
  // One read per node: a load that misses while another one reads the same
  // file waits for that read and shares its outcome.
  bool shared = false;
  Status s = fetching_.Do({job, path}, [&] {
    {
      MutexLock lock(&mu_);
      auto f = files_.find({job, path});
      if (f != files_.end() && f->second.buffer_id != 0) return Status::OK();  // here already
    }
    std::string key;
    uint64_t size = 0;
    const ObjectRoot* root = storage_->ObjectRootOf(path, &key);
    Status r = root ? FetchObjectOnce(*root, key, job, path, uid, gid, &size) : FetchFileOnce(job, path, uid, gid, &size);
    if (r.ok()) loads_.Note(job, LoadFrom::kStorage, size, for_peer);
    if (r.ok() && read_here) *read_here = true;  // only the call that reads runs this
    return r;
  }, &shared, [this] { ++fetches_shared_; });
  return s;
}

Status Cache::FetchObjectOnce(const ObjectRoot& root, const std::string& key, const std::string& job,
                              const std::string& path, uid_t uid, gid_t gid, uint64_t* size) {
  ObjectId obj;
  const Requester who = RequesterOf(uid);  // another uid's object is not read for this one
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
  return InstallFetched(job, path, std::move(mem), obj.size, uid, gid, disk, root.store->Url(key), secs);
}

Status Cache::FetchFileOnce(const std::string& job, const std::string& path, uid_t uid, gid_t gid,
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
  DiskIdentity dir;  // the directory it was read from; Written adds the file
  dir.known = true;
  dir.dir_dev = dst.dev;
  dir.dir_ino = dst.ino;
  dir.parent_ino = parent.ino;
  *size = st.size;
  return InstallFetched(job, path, std::move(mem), st.size, uid, gid, Written(dir, st), path, secs);
}

Status Cache::ReadIntoBuffer(uint64_t size, const std::string& path, const std::function<Status(char*)>& read,
                             std::unique_ptr<Buffer>* mem, double* secs) {
  Status s = ReserveRecovery(size, mem);
  if (!s.ok()) return s;
  s = ReadThroughMapping(**mem, size, path, read, secs);
  if (!s.ok()) AbandonRecovery(std::move(*mem));
  return s;
}

Status Cache::FillBuffer(uint64_t size, const std::string& path,
                         const std::function<Status(const Directory::Sink&)>& read, std::unique_ptr<Buffer>* mem,
                         double* secs) {
  Status s = ReserveRecovery(size, mem);
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
  if (!s.ok()) AbandonRecovery(std::move(*mem));
  return s;
}

Status Cache::ReadThroughMapping(const Buffer& mem, uint64_t size, const std::string& path,
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

Status Cache::JobOwnerIds(const std::string& job, uid_t* uid, gid_t* gid) {
  MutexLock lock(&mu_);
  return JobOwnerIdsLocked(job, uid, gid);
}

Status Cache::JobOwnerIdsLocked(const std::string& job, uid_t* uid, gid_t* gid) const {
  // As the job's owner, never as whoever set the ring (root, for a user's
  // job): the kernel checks the owner's rights, as its own ranks' reads.
  const Ring* ring = rings_.Find(job);
  if (!ring || !ring->has_owner)
    return Status::NotFound("job " + job + " has no ring set here by its user: nothing is read from storage for it");
  gid_t group = JobOwners::kNoGid;
  if (!owners_.Owner(job, uid, &group)) {  // SetRing claims the job: not seen
    *uid = ring->owner_uid;
    group = ring->owner_gid;
  } else if (group == JobOwners::kNoGid && ring->owner_uid == *uid) {
    group = ring->owner_gid;
  }
  if (group == JobOwners::kNoGid)
    return Status::PermissionDenied("job " + job + " belongs to uid " + std::to_string(*uid) +
                                    ", whose group this server does not know (no session of it here): nothing "
                                    "is read from storage for it");
  *gid = group;
  return Status::OK();
}

Status Cache::OpenAsUser(const std::string& dir, uid_t uid, gid_t gid, std::unique_ptr<Directory>* d) {
  FsIdentity as_user(uid, gid);
  if (!as_user.ok(uid)) return Status::PermissionDenied("cannot read storage as uid " + std::to_string(uid));
  return storage_->OpenDirectory(dir, d);
}

Status Cache::InstallFetched(const std::string& job, const std::string& path, std::unique_ptr<Buffer> mem,
                             uint64_t size, uid_t uid, gid_t gid, DiskIdentity disk, const std::string& from,
                             double secs) {
  MutexLock lock(&mu_);
  reserved_ -= mem->capacity();
  const FileKey fk{job, path};
  auto it = files_.find(fk);
  if (it != files_.end() && it->second.buffer_id != 0) {  // saved or fetched meanwhile: that one stays
    lock.Unlock();
    std::unique_ptr<Buffer> unused = std::move(mem);
    return Status::FailedPrecondition(path + " reached the cache meanwhile");
  }
  Buf& buf = Install(std::move(mem));
  buf.state = BufState::kCached;
  buf.uid = uid;
  FileInfo f;
  f.job = job;
  f.path = path;
  f.size = size;
  f.owner_uid = uid;
  f.owner_gid = gid;
  f.buffer_id = buf.id;
  f.capacity = buf.capacity;
  f.state = FileState::kPersisted;
  f.version = next_allocation_id_++;
  f.created_unix_ns = f.committed_unix_ns = f.persisted_unix_ns = clock_->UnixNowNs();
  f.disk = disk;
  f.disk.seq = ++disk_seq_;
  if (it != files_.end()) {
    const FileInfo& was = it->second;
    f.tag = was.tag;
    if (SameStoredFile(was.disk, disk)) {  // the version this server wrote (or knew), brought back
      f.version = was.version;
      f.rank = was.rank;
      f.records = was.records;
      f.created_unix_ns = was.created_unix_ns;
      f.committed_unix_ns = was.committed_unix_ns;
    }
  }
  files_[fk] = f;
  if (!disk.etag.empty()) {
    ++counts_.fetched_objects;
    counts_.fetched_bytes += size;
  }
  Note(f, false);
  TCE_LOG(kInfo, "cache") << "fetched job=" << job << " path=" << path << " from " << from << " size=" << size
                          << " seconds=" << secs << " MBps=" << (secs > 0 ? size / secs / 1e6 : 0);
  return Status::OK();
}

}  // namespace tce
