#include "persist/persister.h"

#include <set>

#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/resource.h>
#include <sys/fsuid.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <deque>
#include <system_error>
#include <thread>
#include <vector>

#include "common/logging.h"
#include "common/mutex.h"
#include "persist/crc.h"
#include "cache/storage_check.h"

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

std::string Dirname(const std::string& path) {
  size_t slash = path.rfind('/');
  return slash == 0 ? "/" : path.substr(0, slash);
}
}  // namespace

Persister::Persister(PersistSource* cache, Env* env, PersistOptions options)
    : cache_(cache), queue_(options.failed_retry, options.clock), env_(env), options_(options) {
  cache_->SetPersistFeed(&queue_);
}

Persister::~Persister() {
  Stop();
  cache_->SetPersistFeed(nullptr);
}


int Persister::RemoveStaleTemps(Env* env, const std::vector<std::string>& roots,
                                const std::vector<std::string>& paths, const std::string& temp_prefix) {
  std::set<std::string> dirs;
  for (const std::string& p : paths) dirs.insert(Dirname(p));
  int total = 0;
  for (const std::string& dir : dirs) {
    std::string resolved;
    if (!env->ResolvePath(dir, &resolved).ok()) continue;
    const std::string* root = RootOf(resolved, roots);
    std::unique_ptr<Directory> d;
    if (!root || !env->OpenDirectory(*root, resolved, /*create=*/false, &d).ok()) continue;
    int removed = 0;
    if (d->RemoveTemps(temp_prefix, &removed).ok()) total += removed;
    if (removed > 0)
      TCE_LOG(kInfo, "persist") << "removed " << removed << " temp file(s) a crash left in " << resolved;
  }
  return total;
}

Status Persister::OpenTargetDir(const std::string& path, bool create, std::unique_ptr<Directory>* out) {
  const std::string dir = Dirname(path);
  std::string resolved;
  Status s = env_->ResolvePath(dir, &resolved);
  if (!s.ok()) return s;
  const std::string* root = RootOf(resolved, cache_->storage_roots());
  if (!root)
    return Status::PermissionDenied(dir + " now resolves to " + resolved +
                                    ", which is not under a storage root: nothing is written there");
  return env_->OpenDirectory(*root, resolved, create, out);
}

void Persister::Start() {
  for (int i = 0; i < options_.threads; ++i) threads_.emplace_back([this] { Loop(); });
}

void Persister::Stop() {
  {
    MutexLock l(&stop_mu_);
    stop_ = true;
  }
  stop_cv_.SignalAll();
  queue_.Stop();
  cache_->StopPersistence();
  for (auto& t : threads_) t.join();
  threads_.clear();
}

bool Persister::SleepUnlessStopping(std::chrono::milliseconds d) {
  const auto deadline = options_.clock->Now() + d;
  MutexLock l(&stop_mu_);
  while (!stop_ && options_.clock->WaitUntil(&stop_cv_, &stop_mu_, deadline)) {
  }
  return !stop_;
}

void Persister::Loop() {
  // Persistence is background work: on a busy node the training ranks'
  // copies come first (nice applies per thread on Linux).
  if (options_.nice > 0) {
    errno = 0;
    if (setpriority(PRIO_PROCESS, static_cast<id_t>(syscall(SYS_gettid)), options_.nice) != 0)
      TCE_LOG(kWarning, "persist") << "setpriority: " << std::strerror(errno);
  }
  PersistQueue::Item item;
  PersistJob job;
  while (queue_.Next(&item)) {
    if (!cache_->StartPersist(item.key, item.retry, &job)) continue;
    std::vector<Record> records = job.records;
    FileStat written;
    const Stopwatch took(options_.clock);
    Status s = Persist(job, &records, &written);
    const double secs = took.Seconds();
    ::close(job.fd);
    if (s.code() == Status::Code::kAborted) {
      TCE_LOG(kDebug, "persist") << "skipped superseded version of path=" << job.path;
    } else if (s.code() == Status::Code::kCancelled) {
      TCE_LOG(kWarning, "persist") << "DISCARDED job=" << job.job << " path=" << job.path << ": "
                                   << s.message();
    } else if (s.ok()) {
      if (options_.metrics) options_.metrics->Succeeded(job.size, secs);
      TCE_LOG(kInfo, "persist") << "persisted job=" << job.job << " path=" << job.path
                                << " size=" << job.size << " seconds=" << secs << " MBps="
                                << (secs > 0 ? job.size / secs / 1e6 : 0);
    } else {
      TCE_LOG(kError, "persist") << "FAILED job=" << job.job << " path=" << job.path << ": "
                                 << s.ToString();
    }
    cache_->FinishPersist(job, s, std::move(records), written);
  }
}

// Files are written with the committing client's filesystem identity, so the
// kernel checks that client's permissions and the files belong to it. Only a
// root server can (and needs to) switch; fsuid/fsgid are per thread.
class FsIdentity {
 public:
  FsIdentity(uid_t uid, gid_t gid) {
    if (geteuid() != 0 || uid == 0) return;
    if (gid != static_cast<gid_t>(-1)) setfsgid(gid);
    setfsuid(uid);
    switched_ = true;
  }
  ~FsIdentity() {
    if (!switched_) return;
    setfsuid(0);
    setfsgid(0);
  }
  bool ok(uid_t uid) const {
    return !switched_ || static_cast<uid_t>(setfsuid(static_cast<uid_t>(-1))) == uid;
  }

 private:
  bool switched_ = false;
};

Status Persister::Persist(const PersistJob& job, std::vector<Record>* records, FileStat* written) {
  std::string key;
  if (const ObjectRoot* root = options_.objects ? options_.objects->Find(job.path, &key) : nullptr)
    return PersistObject(job, *root, key, records, written);
  FsIdentity as_client(job.uid, job.gid);
  if (!as_client.ok(job.uid))
    return Status::PermissionDenied("cannot write as uid " + std::to_string(job.uid));
  Status s = ValidateZipTable(job.fd, job.size, *records);
  if (!s.ok()) return Status::InvalidArgument("the record table does not match the file: " + s.message());
  // Map whole pages (O_DIRECT writes whole blocks; the tail is truncated).
  const uint64_t mapped = std::min<uint64_t>(RoundUp(job.size, kBlock), job.capacity);
  void* map = mmap(nullptr, mapped, PROT_READ | PROT_WRITE, MAP_SHARED, job.fd, 0);
  if (map == MAP_FAILED) return Status::FromErrno(errno, "mmap buffer " + std::to_string(job.buffer_id));
  auto* data = static_cast<unsigned char*>(map);
  ZipCrcStream crcs(*records, job.size, /*patch=*/job.zip_crc32);
  bool direct = options_.direct_io && mapped % kBlock == 0;
  std::chrono::milliseconds yielded(0);
  for (int attempt = 0;; ++attempt) {
    s = PersistOnce(job, data, mapped, direct, &crcs, &yielded, written);
    if (s.code() == Status::Code::kUnimplemented && direct) {  // no O_DIRECT here
      direct = false;
      --attempt;
      continue;
    }
    if (s.ok() || s.code() == Status::Code::kAborted || s.code() == Status::Code::kCancelled) break;
    if (options_.metrics) options_.metrics->Failed();
    if (attempt >= options_.retries) break;
    auto delay = options_.backoff * (1 << std::min(attempt, 10));
    TCE_LOG(kWarning, "persist") << "retrying path=" << job.path << " in " << delay.count()
                                 << "ms (attempt " << attempt + 1 << " of " << options_.retries
                                 << "): " << s.ToString();
    if (!SleepUnlessStopping(delay)) break;
  }
  *records = crcs.records();
  munmap(map, mapped);
  if (yielded.count() > 0)
    TCE_LOG(kDebug, "persist") << "path=" << job.path << " yielded " << yielded.count()
                               << "ms to saves in flight";
  return s;
}

StorageCheck Persister::StillThere(const std::string& path, Directory* dir, const DiskIdentity& expected) {
  StorageCheck c = CheckDirectory(dir, path, expected);  // removed while open?
  if (c.verdict != Verdict::kSame) return c;
  std::unique_ptr<Directory> again;  // moved away (and maybe replaced)?
  Status s = OpenTargetDir(path, /*create=*/false, &again);
  if (!s.ok()) return ClassifyOpenFailure(env_, path.substr(0, path.rfind('/')), s, expected);
  return CheckDirectory(again.get(), path, expected);
}

Status Persister::PersistOnce(const PersistJob& job, unsigned char* data, uint64_t mapped,
                              bool direct, ZipCrcStream* crcs, std::chrono::milliseconds* yielded,
                              FileStat* written) {
  const std::string name = job.path.substr(job.path.rfind('/') + 1);
  const DiskIdentity& expected = job.expected;
  std::unique_ptr<Directory> dir;
  Status s = OpenTargetDir(job.path, /*create=*/!expected.known, &dir);
  if (!s.ok() && expected.known) {
    StorageCheck c = ClassifyOpenFailure(env_, job.path.substr(0, job.path.rfind('/')), s, expected);
    if (c.verdict == Verdict::kChanged) return Status::Cancelled(c.why);
  }
  if (!s.ok()) return s;
  if (expected.known) {
    StorageCheck c = CheckDirectory(dir.get(), job.path, expected);
    if (c.verdict == Verdict::kChanged) return Status::Cancelled(c.why);
    if (c.verdict == Verdict::kUnavailable) return Status::Unavailable(c.why);
  }
  std::unique_ptr<TempFile> file;
  s = dir->NewTempFile(options_.temp_prefix, direct, &file);
  if (!s.ok()) return s;
  // Direct writes go out io_depth at a time (a chunk's CRC patches only land
  // at or after that chunk, so chunks in flight are never touched again).
  InFlight writes(file.get(), direct ? options_.io_depth : 1);
  for (uint64_t off = 0; s.ok() && off < job.size; off += options_.chunk) {
    if (*yielded < options_.max_yield) *yielded += cache_->WaitForNoSaves(options_.max_yield - *yielded);
    uint64_t n = std::min<uint64_t>(options_.chunk, job.size - off);
    if (off == crcs->fed()) crcs->Feed(off, data + off, static_cast<size_t>(n));  // CRCs, in place
    if (direct) n = std::min(RoundUp(n, kBlock), mapped - off);
    if (writes.depth() > 1) {
      s = writes.Submit(off, reinterpret_cast<const char*>(data + off), static_cast<size_t>(n));
      continue;
    }
    s = file->Append(reinterpret_cast<const char*>(data + off), static_cast<size_t>(n));
    if (s.ok() && !direct) s = file->StartWriteback(off, n);
  }
  Status flushed = writes.Finish();
  if (s.ok()) s = flushed;
  if (s.ok() && direct) s = file->Truncate(job.size);
  if (s.ok()) s = file->Sync();
  if (s.ok()) {
    MutexLock l(&rename_mu_);
    // Last look before the rename: the path must still hold what the save
    // found there. A file being replaced lends its permission bits.
    FileStat there;
    bool exists = false;
    StorageCheck c;
    if (expected.known) c = StillThere(job.path, dir.get(), expected);
    if (expected.known && c.verdict == Verdict::kSame)
      c = CheckEntry(dir.get(), job.path, name, expected, &there, &exists);
    else if (!expected.known)
      exists = dir->StatAt(name, &there).ok();
    if (!cache_->IsCurrent(job)) {
      s = Status::Aborted("superseded by a newer version");
    } else if (c.verdict == Verdict::kChanged) {
      s = Status::Cancelled(c.why);
    } else if (c.verdict == Verdict::kUnavailable) {
      s = Status::Unavailable(c.why);
    } else {
      s = file->SetMode(exists && S_ISREG(there.mode) ? there.mode & 0777 : job.new_mode & 0777);
      if (s.ok()) s = file->Publish(name);
      if (s.ok() && !file->Stat(written).ok()) *written = FileStat();  // loads then read storage
    }
  }
  if (!s.ok()) file->Discard();
  Status closed = file->Close();
  if (s.ok()) s = closed;
  if (!s.ok()) return s;
  return dir->Sync();
}

}  // namespace tce
