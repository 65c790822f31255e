#include "persist/persister.h"

#include <set>

#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <thread>
#include <vector>

#include "common/logging.h"
#include "common/mutex.h"
#include "persist/crc.h"
#include "cache/storage_check.h"

namespace tce {
namespace {
constexpr uint64_t kBlock = 4096;  // O_DIRECT alignment: files are mapped in whole blocks
uint64_t RoundUp(uint64_t v, uint64_t to) { return (v + to - 1) / to * to; }

}  // namespace

namespace {
// Lane 0: the directory roots; lane i: object root i - 1.
size_t Lanes(const PersistOptions& o) { return 1 + (o.storage ? o.storage->objects().all().size() : 0); }
PersistQueue::LaneOf LaneOf(const PersistOptions& o) {
  std::shared_ptr<const StorageRoots> roots = o.storage;
  if (!roots || roots->objects().empty()) return nullptr;
  return [roots](const FileKey& key) -> size_t {
    const ObjectRoot* root = roots->ObjectRootOf(key.second, nullptr);
    return root ? 1 + static_cast<size_t>(root - roots->objects().all().data()) : 0;
  };
}
}  // namespace

std::unique_ptr<PersistQueue> Persister::MakeQueue(const PersistOptions& options) {
  return std::make_unique<PersistQueue>(options.failed_retry, options.clock, Lanes(options), LaneOf(options));
}

Persister::Persister(PersistSource* cache, PersistQueue* queue, Env* env, PersistOptions options)
    : cache_(cache), queue_(queue), env_(env), options_(options) {}

Persister::~Persister() { Stop(); }


int Persister::RemoveStaleTemps(const StorageRoots& roots, const std::vector<std::string>& paths,
                                const std::string& temp_prefix) {
  std::set<std::string> dirs;
  for (const std::string& p : paths)
    if (!roots.ObjectRootOf(p, nullptr)) dirs.insert(Dirname(p));
  int total = 0;
  for (const std::string& dir : dirs) {
    std::string resolved;
    std::unique_ptr<Directory> d;
    if (!roots.OpenDirectory(dir, &d, &resolved).ok()) continue;
    int removed = 0;
    if (d->RemoveTemps(temp_prefix, &removed).ok()) total += removed;
    if (removed > 0)
      TCE_LOG(kInfo, "persist") << "removed " << removed << " temp file(s) a crash left in " << resolved;
  }
  return total;
}

void Persister::Start() {
  for (size_t lane = 0; lane < queue_->lanes(); ++lane)
    for (int i = 0; i < options_.threads; ++i) threads_.emplace_back([this, lane] { Loop(lane); });
}

void Persister::Stop() {
  {
    MutexLock l(&stop_mu_);
    stop_ = true;
  }
  stop_cv_.SignalAll();
  queue_->Stop();
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

void Persister::Loop(size_t lane) {
  // Persistence is background work: on a busy node the training ranks'
  // copies come first (nice applies per thread on Linux).
  if (options_.nice > 0) {
    errno = 0;
    if (setpriority(PRIO_PROCESS, static_cast<id_t>(syscall(SYS_gettid)), options_.nice) != 0)
      TCE_LOG(kWarning, "persist") << "setpriority: " << std::strerror(errno);
  }
  PersistQueue::Item item;
  PersistJob job;
  while (queue_->Next(&item, lane)) {
    if (!cache_->StartPersist(item.key, item.retry, &job)) continue;
    std::vector<Record> records = job.records;
    FileStat written;
    Mapping map;  // unmapped after FinishPersist
    const Stopwatch took(options_.clock);
    Status s = Persist(job, &map, &records, &written);
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

Status Persister::StoreOf(const PersistJob& job, ObjectStore** store, std::string* key) {
  if (!options_.storage) return Status::FailedPrecondition("no storage root: " + job.path + " stays in memory");
  // Located now, at each attempt: the root check at Allocate is not trusted
  // at write time.
  StorageRoots::Location at;
  Status s = options_.storage->Locate(job.path, &at);
  if (!s.ok()) {
    if (job.expected.known) {
      StorageCheck c = ClassifyOpenFailure(env_, Dirname(job.path), s, job.expected);
      if (c.verdict == Verdict::kChanged) return Status::Cancelled(c.why);
    }
    if (s.code() == Status::Code::kPermissionDenied) s = Status::PermissionDenied(s.message() + ": nothing is written there");
    return s;
  }
  *store = at.store;
  *key = at.key;
  return Status::OK();
}

Persister::Mapping::~Mapping() {
  if (addr) munmap(addr, len);
}

Status Persister::Persist(const PersistJob& job, Mapping* map, std::vector<Record>* records, FileStat* written) {
  Status s = ValidateZipTable(job.fd, job.size, *records);
  if (!s.ok()) return Status::InvalidArgument("the record table does not match the file: " + s.message());
  // Map whole blocks (O_DIRECT writes whole blocks; the tail is truncated).
  const uint64_t mapped = std::max<uint64_t>(std::min<uint64_t>(RoundUp(job.size, kBlock), job.capacity), 1);
  void* addr = mmap(nullptr, mapped, PROT_READ | PROT_WRITE, MAP_SHARED, job.fd, 0);
  if (addr == MAP_FAILED) return Status::FromErrno(errno, "mmap buffer " + std::to_string(job.buffer_id));
  map->addr = addr;
  map->len = mapped;
  auto* data = static_cast<unsigned char*>(addr);
  ZipCrcStream crcs(*records, job.size, /*patch=*/job.zip_crc32);
  // The CRCs are computed (and patched in) as the bytes go: those below
  // `end` before the chunk or part that ends there is written. A CRC patch
  // only lands at or after the bytes fed, so nothing already written is
  // touched again, and a retry resumes where a failed attempt stopped.
  // Between chunks the write yields to saves in flight (training first), at
  // most max_yield in all.
  Mutex crc_mu;
  std::chrono::milliseconds yielded(0);
  WriteOptions w;
  w.prepare = [&](uint64_t end) {
    MutexLock l(&crc_mu);
    if (yielded < options_.max_yield) yielded += cache_->WaitForNoSaves(options_.max_yield - yielded);
    if (crcs.fed() >= end) return;
    const uint64_t from = crcs.fed();
    crcs.Feed(from, data + from, static_cast<size_t>(std::min(end, job.size) - from));
  };
  w.before_commit = [&]() -> Status {
    return cache_->IsCurrent(job) ? Status::OK() : Status::Aborted("superseded by a newer version");
  };
  w.expected = &job.expected;
  w.write_id = std::to_string(job.version);  // an attempt that landed unanswered is this write's
  w.uid = job.uid;
  w.gid = job.gid;
  w.new_mode = job.new_mode;
  w.create_dirs = !job.expected.known;  // only a file whose save this server never saw
  w.readable = mapped;
  for (int attempt = 0;; ++attempt) {
    ObjectStore* store = nullptr;
    std::string key;
    s = StoreOf(job, &store, &key);
    if (s.ok()) s = store->Write(key, reinterpret_cast<const char*>(data), job.size, w, written);
    if (s.ok() || s.code() == Status::Code::kAborted || s.code() == Status::Code::kCancelled) break;
    if (options_.metrics) options_.metrics->Failed();
    if ((store && !store->Retryable(s)) || attempt >= options_.retries) break;
    auto delay = options_.backoff * (1 << std::min(attempt, 10));
    TCE_LOG(kWarning, "persist") << "retrying " << (store ? store->Url(key) : job.path) << " (path=" << job.path
                                 << ") in " << delay.count() << "ms (attempt " << attempt + 1 << " of "
                                 << options_.retries << "): " << s.ToString();
    if (!SleepUnlessStopping(delay)) break;
  }
  w.prepare(job.size);  // every CRC, even when the write failed before the end (a retry resumes)
  *records = crcs.records();
  if (yielded.count() > 0)
    TCE_LOG(kDebug, "persist") << "path=" << job.path << " yielded " << yielded.count()
                               << "ms to saves in flight";
  return s;
}

}  // namespace tce
