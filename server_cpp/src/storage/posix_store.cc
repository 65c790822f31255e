#include "storage/posix_store.h"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <deque>
#include <functional>
#include <system_error>
#include <thread>

#include "common/logging.h"
#include "env/fs_identity.h"

namespace tce {
namespace {
constexpr uint64_t kBlock = 4096;  // O_DIRECT alignment used for every write
uint64_t RoundUp(uint64_t v, uint64_t to) { return (v + to - 1) / to * to; }

// Positional writes of one file on `depth` threads (none for depth 1):
// Submit waits while `depth` writes are in flight and returns the first
// error any of them met; Finish waits for the rest.
class InFlight {
 public:
  InFlight(WritableFile* file, int depth) : file_(file), depth_(std::max(1, depth)) {
    for (int i = 0; depth_ > 1 && i < depth_; ++i) {
      try {
        threads_.emplace_back([this] { Run(); });
      } catch (const std::system_error& e) {  // out of threads (a pids limit): fewer writes in flight
        TCE_LOG(kWarning, "persist") << "cannot start an I/O thread (" << e.what() << "): "
                                     << threads_.size() << " of " << depth_ << " writes in flight";
        break;
      }
    }
    if (threads_.size() < 2) depth_ = 1;  // the caller writes itself; a lone thread just waits to end
  }
  ~InFlight() { (void)Finish(); }  // an early return already has its error
  int depth() const { return depth_; }

  Status Submit(uint64_t offset, const char* data, size_t n) {
    MutexLock l(&mu_);
    while (queue_.size() + busy_ >= threads_.size() && error_.ok()) cv_.Wait(&mu_);
    if (!error_.ok()) return error_;
    queue_.push_back({offset, data, n});
    cv_.SignalAll();
    return Status::OK();
  }

  Status Finish() {
    {
      MutexLock l(&mu_);
      done_ = true;
    }
    cv_.SignalAll();
    for (auto& t : threads_) t.join();
    threads_.clear();
    MutexLock l(&mu_);
    return error_;
  }

 private:
  struct Write {
    uint64_t offset;
    const char* data;
    size_t n;
  };

  void Run() {
    MutexLock l(&mu_);
    for (;;) {
      while (queue_.empty() && !done_) cv_.Wait(&mu_);
      if (queue_.empty()) return;
      Write w = queue_.front();
      queue_.pop_front();
      ++busy_;
      const bool failed = !error_.ok();  // after a failure the rest are dropped
      l.Unlock();
      Status s = failed ? Status::OK() : file_->WriteAt(w.offset, w.data, w.n);
      l.Lock();
      --busy_;
      if (!s.ok() && error_.ok()) error_ = s;
      cv_.SignalAll();
    }
  }

  WritableFile* const file_;
  int depth_;
  std::vector<std::thread> threads_;
  Mutex mu_;
  CondVar cv_;
  std::deque<Write> queue_ GUARDED_BY(mu_);
  size_t busy_ GUARDED_BY(mu_) = 0;
  bool done_ GUARDED_BY(mu_) = false;
  Status error_ GUARDED_BY(mu_);
};

// A key: components below the root, none empty, "." or "..".
bool ValidKey(const std::string& key) {
  if (key.empty() || key.front() == '/' || key.back() == '/') return false;
  size_t at = 0;
  for (;;) {
    const size_t slash = key.find('/', at);
    const std::string part = key.substr(at, slash == std::string::npos ? std::string::npos : slash - at);
    if (part.empty() || part == "." || part == "..") return false;
    if (slash == std::string::npos) return true;
    at = slash + 1;
  }
}

}  // namespace

Status PosixStore::CheckLocation(const std::string& location) {
  if (location.empty() || location[0] != '/' || (location + "/").find("/../") != std::string::npos)
    return Status::InvalidArgument("not a directory root (want file:///ABSOLUTE/DIR)");
  return Status::OK();
}

Status PosixStore::Open(const std::string& location, const PosixStoreOptions& options,
                        std::shared_ptr<ObjectStore>* out, std::string* prefix) {
  if (Status s = CheckLocation(location); !s.ok()) return s;
  if (!options.env) return Status::InvalidArgument("a directory root's store needs an Env");
  std::string dir = location;
  while (dir.size() > 1 && dir.back() == '/') dir.pop_back();
  prefix->clear();
  *out = std::make_shared<PosixStore>(dir, options);
  return Status::OK();
}

PosixStore::PosixStore(std::string root, const PosixStoreOptions& options)
    : root_(std::move(root)), options_(options) {}

PosixStore::~PosixStore() {
  std::thread releaser;
  {
    MutexLock l(&release_mu_);
    stopping_ = true;
    releaser = std::move(releaser_);
  }
  release_cv_.SignalAll();
  if (releaser.joinable()) releaser.join();  // it frees what is queued before it ends
}

void PosixStore::Release(std::unique_ptr<TempFile> file) {
  MutexLock l(&release_mu_);
  if (!releaser_.joinable() && !stopping_) {
    try {
      releaser_ = std::thread([this] { ReleaseLoop(); });
    } catch (const std::system_error& e) {  // out of threads (a pids limit): freed here
      TCE_LOG(kWarning, "persist") << "cannot start the thread that frees replaced files (" << e.what()
                                   << "): this write frees its own";
    }
  }
  if (!releaser_.joinable()) {
    l.Unlock();
    file.reset();
    return;
  }
  released_.push_back(std::move(file));
  release_cv_.SignalAll();
}

void PosixStore::ReleaseLoop() {
  MutexLock l(&release_mu_);
  for (;;) {
    while (released_.empty() && !stopping_) release_cv_.Wait(&release_mu_);
    if (released_.empty()) return;
    std::vector<std::unique_ptr<TempFile>> batch = std::move(released_);
    released_.clear();
    l.Unlock();
    batch.clear();  // each closes the file it replaced: its blocks are freed here
    l.Lock();
  }
}

std::string PosixStore::Url(const std::string& key) const { return root_ == "/" ? "/" + key : root_ + "/" + key; }

std::string PosixStore::EtagOf(const FileStat& st) {
  char buf[96];
  std::snprintf(buf, sizeof buf, "%llx-%llx-%llx-%llx", static_cast<unsigned long long>(st.dev),
                static_cast<unsigned long long>(st.ino), static_cast<unsigned long long>(st.size),
                static_cast<unsigned long long>(st.mtime_ns));
  return buf;
}

Status PosixStore::OpenDir(const std::string& key, bool create, std::unique_ptr<Directory>* dir, std::string* name,
                           std::string* dir_path) const {
  const size_t slash = key.rfind('/');
  *name = slash == std::string::npos ? key : key.substr(slash + 1);
  *dir_path = slash == std::string::npos ? root_ : Url(key.substr(0, slash));
  if (!ValidKey(key)) return Status::InvalidArgument("'" + key + "' is not a name below " + root_);
  return options_.env->OpenDirectory(root_, *dir_path, create, dir);
}

Status PosixStore::OpenDirectory(const std::string& dir_key, bool create, std::unique_ptr<Directory>* out) const {
  if (!dir_key.empty() && !ValidKey(dir_key))
    return Status::InvalidArgument("'" + dir_key + "' is not a directory below " + root_);
  return options_.env->OpenDirectory(root_, dir_key.empty() ? root_ : Url(dir_key), create, out);
}

Status PosixStore::Write(const std::string& key, const char* data, uint64_t n, const WriteOptions& options,
                         FileStat* out) {
  FsIdentity as_client(options.uid, options.gid);
  if (!as_client.ok(options.uid))
    return Status::PermissionDenied("cannot write as uid " + std::to_string(options.uid));
  const uint64_t readable = std::max(options.readable, n);
  const bool direct = options_.direct_io && readable % kBlock == 0 &&
                      reinterpret_cast<uintptr_t>(data) % kBlock == 0;
  Status s = WriteOnce(key, data, n, options, direct, out);
  if (s.code() == Status::Code::kUnimplemented && direct)  // no O_DIRECT on this filesystem
    s = WriteOnce(key, data, n, options, /*direct=*/false, out);
  return s;
}

StorageCheck PosixStore::StillThere(const std::string& dir_path, const std::string& url, Directory* dir,
                                    const DiskIdentity& expected) {
  StorageCheck c = CheckDirectory(dir, url, expected);  // removed while open?
  if (c.verdict != Verdict::kSame) return c;
  std::unique_ptr<Directory> again;  // moved away (and maybe replaced)?
  Status s = options_.env->OpenDirectory(root_, dir_path, /*create=*/false, &again);
  if (!s.ok()) return ClassifyOpenFailure(options_.env, dir_path, s, expected);
  return CheckDirectory(again.get(), url, expected);
}

Status PosixStore::WriteOnce(const std::string& key, const char* data, uint64_t n, const WriteOptions& options,
                             bool direct, FileStat* out) {
  const DiskIdentity* expected = options.expected && options.expected->known ? options.expected : nullptr;
  const std::string url = Url(key);
  std::unique_ptr<Directory> dir;
  std::string name, dir_path;
  Status s = OpenDir(key, /*create=*/options.create_dirs, &dir, &name, &dir_path);
  if (!s.ok() && expected) {
    StorageCheck c = ClassifyOpenFailure(options_.env, dir_path, s, *expected);
    if (c.verdict == Verdict::kChanged) return Status::Cancelled(c.why);
  }
  if (!s.ok()) return s;
  if (expected) {
    StorageCheck c = CheckDirectory(dir.get(), url, *expected);
    if (c.verdict == Verdict::kChanged) return Status::Cancelled(c.why);
    if (c.verdict == Verdict::kUnavailable) return Status::Unavailable(c.why);
  }
  std::unique_ptr<TempFile> file;
  s = dir->NewTempFile(options_.temp_prefix, direct, &file);
  if (!s.ok()) return s;
  const uint64_t readable = std::max(options.readable, n);
  // Direct writes go out io_depth at a time (`prepare` only touches bytes
  // at or after those it was asked for, so chunks in flight are never
  // touched again), into blocks reserved first: a direct write that extends
  // the file is serialized with every other (ext4), one inside it is not.
  InFlight writes(file.get(), direct ? options_.io_depth : 1);
  if (writes.depth() > 1) {
    Status reserved = file->Preallocate(readable);
    if (!reserved.ok() && reserved.code() != Status::Code::kUnimplemented) s = reserved;  // ENOSPC: now, not mid-file
  }
  for (uint64_t off = 0; s.ok() && off < n; off += options_.chunk) {
    uint64_t len = std::min<uint64_t>(options_.chunk, n - off);
    if (options.prepare) options.prepare(off + len);
    if (direct) len = std::min(RoundUp(len, kBlock), readable - off);
    if (writes.depth() > 1) {
      s = writes.Submit(off, data + off, static_cast<size_t>(len));
      continue;
    }
    s = file->Append(data + off, static_cast<size_t>(len));
    if (s.ok() && !direct) s = file->StartWriteback(off, len);
  }
  Status flushed = writes.Finish();
  if (s.ok()) s = flushed;
  if (s.ok() && direct) s = file->Truncate(n);
  if (s.ok()) s = file->Sync();
  if (s.ok()) {
    MutexLock l(&publish_mu_);
    // The last look before the rename: the name must still hold what the
    // save found there. A file being replaced lends its permission bits.
    FileStat there;
    bool exists = false;
    StorageCheck c;
    if (expected) c = StillThere(dir_path, url, dir.get(), *expected);
    if (expected && c.verdict == Verdict::kSame)
      c = CheckEntry(dir.get(), url, name, *expected, &there, &exists);
    else if (!expected)
      exists = dir->StatAt(name, &there).ok();
    Status last = options.before_commit ? options.before_commit() : Status::OK();
    if (!last.ok()) {
      s = last;
    } else if (c.verdict == Verdict::kChanged) {
      s = Status::Cancelled(c.why);
    } else if (c.verdict == Verdict::kUnavailable) {
      s = Status::Unavailable(c.why);
    } else {
      s = file->SetMode(exists && S_ISREG(there.mode) ? there.mode & 0777 : options.new_mode & 0777);
      if (s.ok()) s = file->Publish(name);
      if (s.ok() && !file->Stat(out).ok()) *out = FileStat();  // loads then read storage
    }
  }
  if (!s.ok()) file->Discard();
  Status closed = file->Close();
  if (s.ok()) s = closed;
  if (s.ok()) s = dir->Sync();
  Release(std::move(file));  // the replaced version is freed after this returns
  return s;
}

Status PosixStore::Read(const std::string& key, uint64_t offset, uint64_t n, char* into, const std::string& etag,
                        const Requester&) {
  std::unique_ptr<Directory> dir;
  std::string name, dir_path;
  Status s = OpenDir(key, /*create=*/false, &dir, &name, &dir_path);
  if (s.code() == Status::Code::kNotFound) return Status::NotFound(Url(key) + " does not exist");
  if (!s.ok()) return s;
  if (!etag.empty()) {
    FileStat st;
    s = dir->StatAt(name, &st);
    if (!s.ok()) return s;
    if (EtagOf(st) != etag) return Status::FailedPrecondition(Url(key) + " was replaced or modified");
  }
  return dir->ReadAt(name, offset, n, into);
}

Status PosixStore::Stat(const std::string& key, ObjectId* out) {
  *out = ObjectId();
  std::unique_ptr<Directory> dir;
  std::string name, dir_path;
  Status s = OpenDir(key, /*create=*/false, &dir, &name, &dir_path);
  if (s.code() == Status::Code::kNotFound) return Status::OK();
  if (!s.ok()) return s;
  FileStat st;
  s = dir->StatAt(name, &st);
  if (s.code() == Status::Code::kNotFound) return Status::OK();
  if (!s.ok()) return s;
  if (!S_ISREG(st.mode)) return Status::FailedPrecondition(Url(key) + " is not a regular file");
  out->exists = true;
  out->size = st.size;
  out->etag = EtagOf(st);
  return Status::OK();
}

Status PosixStore::List(const std::string& prefix, const Requester&, std::vector<ListedObject>* out) {
  out->clear();
  // Walk from the deepest directory the prefix names whole; keep the
  // regular files whose keys start with it (no symlink is followed, temp
  // files are not files yet).
  const size_t slash = prefix.rfind('/');
  std::vector<std::string> pending{slash == std::string::npos ? "" : prefix.substr(0, slash)};
  if (!pending.back().empty() && !ValidKey(pending.back()))
    return Status::InvalidArgument("'" + prefix + "' is not a prefix below " + root_);
  while (!pending.empty()) {
    const std::string rel = pending.back();
    pending.pop_back();
    std::unique_ptr<Directory> dir;
    Status s = options_.env->OpenDirectory(root_, rel.empty() ? root_ : Url(rel), /*create=*/false, &dir);
    if (s.code() == Status::Code::kNotFound) continue;
    if (!s.ok()) return s;
    std::vector<std::pair<std::string, FileStat>> entries;
    s = dir->List(&entries);
    if (!s.ok()) return s;
    for (const auto& [name, st] : entries) {
      const std::string key = rel.empty() ? name : rel + "/" + name;
      if (S_ISDIR(st.mode)) {
        const std::string with_slash = key + "/";
        if (with_slash.compare(0, std::min(with_slash.size(), prefix.size()), prefix, 0,
                               std::min(with_slash.size(), prefix.size())) == 0)
          pending.push_back(key);
      } else if (S_ISREG(st.mode) && key.compare(0, prefix.size(), prefix) == 0 &&
                 name.compare(0, options_.temp_prefix.size(), options_.temp_prefix) != 0) {
        out->push_back({key, st.size});
      }
    }
  }
  std::sort(out->begin(), out->end(), [](const ListedObject& a, const ListedObject& b) { return a.key < b.key; });
  return Status::OK();
}

Status PosixStore::Delete(const std::string& key, const Requester&) {
  std::unique_ptr<Directory> dir;
  std::string name, dir_path;
  Status s = OpenDir(key, /*create=*/false, &dir, &name, &dir_path);
  if (s.code() == Status::Code::kNotFound) return Status::OK();
  if (!s.ok()) return s;
  s = dir->Remove(name);
  if (s.code() == Status::Code::kNotFound) return Status::OK();
  if (!s.ok()) return s;
  return dir->Sync();
}

}  // namespace tce
