#include "persist/persister.h"

#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "common/logging.h"
#include "persist/crc.h"

namespace tce {
namespace {
std::string Dirname(const std::string& path) {
  size_t slash = path.rfind('/');
  return slash == 0 ? "/" : path.substr(0, slash);
}
}  // namespace

Persister::Persister(Cache* cache, Env* env, PersistOptions options)
    : cache_(cache), env_(env), options_(options) {}

Persister::~Persister() { Stop(); }

std::string Persister::TempPath(const std::string& path, uint64_t version) {
  size_t slash = path.rfind('/');
  return path.substr(0, slash + 1) + "." + path.substr(slash + 1) + ".tce-tmp-" +
         std::to_string(version);
}

void Persister::Start() {
  for (int i = 0; i < options_.threads; ++i) threads_.emplace_back([this] { Loop(); });
}

void Persister::Stop() {
  {
    std::lock_guard<std::mutex> l(stop_mu_);
    stop_ = true;
  }
  stop_cv_.notify_all();
  cache_->StopPersistence();
  for (auto& t : threads_) t.join();
  threads_.clear();
}

bool Persister::SleepUnlessStopping(std::chrono::milliseconds d) {
  std::unique_lock<std::mutex> l(stop_mu_);
  return !stop_cv_.wait_for(l, d, [this] { return stop_; });
}

void Persister::Loop() {
  // Persistence is background work: on a busy node the training ranks'
  // copies come first (nice applies per thread on Linux).
  if (options_.nice > 0) {
    errno = 0;
    if (setpriority(PRIO_PROCESS, static_cast<id_t>(syscall(SYS_gettid)), options_.nice) != 0)
      TCE_LOG(kWarning, "persist") << "setpriority: " << std::strerror(errno);
  }
  std::unique_ptr<unsigned char[]> chunk(new unsigned char[options_.chunk]);
  PersistJob job;
  while (cache_->NextPersistJob(&job)) {
    std::vector<Record> records = job.records;
    auto t0 = std::chrono::steady_clock::now();
    Status s = Persist(job, chunk.get(), &records);
    double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    ::close(job.fd);
    if (s.code() == Status::Code::kAborted) {
      TCE_LOG(kDebug, "persist") << "skipped superseded version of path=" << job.path;
    } else if (s.ok()) {
      TCE_LOG(kInfo, "persist") << "persisted job=" << job.job << " path=" << job.path
                                << " size=" << job.size << " seconds=" << secs << " MBps="
                                << (secs > 0 ? job.size / secs / 1e6 : 0);
    } else {
      TCE_LOG(kError, "persist") << "FAILED job=" << job.job << " path=" << job.path << ": "
                                 << s.ToString();
    }
    cache_->FinishPersist(job, s, std::move(records));
  }
}

Status Persister::Persist(const PersistJob& job, unsigned char* chunk,
                          std::vector<Record>* records) {
  Status s = ValidateZipTable(job.fd, job.size, *records);
  if (!s.ok()) return Status::InvalidArgument("the record table does not match the file: " + s.message());
  std::vector<std::pair<uint64_t, uint32_t>> fields;
  for (int attempt = 0;; ++attempt) {
    s = PersistOnce(job, chunk, records, &fields);
    if (s.ok() || s.code() == Status::Code::kAborted || attempt >= options_.retries) break;
    auto delay = options_.backoff * (1 << std::min(attempt, 10));
    TCE_LOG(kWarning, "persist") << "retrying path=" << job.path << " in " << delay.count()
                                 << "ms (attempt " << attempt + 1 << " of " << options_.retries
                                 << "): " << s.ToString();
    if (!SleepUnlessStopping(delay)) break;
  }
  if (!s.ok()) return s;
  // The cached copy gets the same CRCs, so every later reader (a backup, a
  // load) sees the bytes that are on disk.
  for (const auto& [offset, crc] : fields) {
    unsigned char bytes[4];
    for (int k = 0; k < 4; ++k) bytes[k] = static_cast<unsigned char>(crc >> (8 * k));
    if (pwrite(job.fd, bytes, 4, static_cast<off_t>(offset)) != 4)
      return Status::FromErrno(errno, "patching CRCs into buffer " + std::to_string(job.buffer_id));
  }
  return Status::OK();
}

Status Persister::PersistOnce(const PersistJob& job, unsigned char* chunk,
                              std::vector<Record>* records,
                              std::vector<std::pair<uint64_t, uint32_t>>* crc_fields) {
  const std::string dir = Dirname(job.path);
  const std::string tmp = TempPath(job.path, job.version);
  Status s = env_->CreateDirs(dir);
  if (!s.ok()) return s;
  std::unique_ptr<WritableFile> file;
  s = env_->NewWritableFile(tmp, &file);
  ZipCrcStream crcs(*records, job.size);
  for (uint64_t off = 0; s.ok() && off < job.size;) {
    size_t n = static_cast<size_t>(std::min<uint64_t>(options_.chunk, job.size - off));
    ssize_t got = pread(job.fd, chunk, n, static_cast<off_t>(off));
    if (got <= 0) {
      s = got < 0 && errno == EINTR ? Status::OK()
                                    : Status::FromErrno(got < 0 ? errno : EIO, "reading the buffer");
      continue;
    }
    crcs.Feed(off, chunk, static_cast<size_t>(got));
    s = file->Append(reinterpret_cast<const char*>(chunk), static_cast<size_t>(got));
    if (s.ok()) s = file->StartWriteback(off, static_cast<uint64_t>(got));
    off += static_cast<uint64_t>(got);
  }
  if (s.ok()) s = file->Sync();
  if (file) {
    Status c = file->Close();
    if (s.ok()) s = c;
  }
  if (s.ok()) {
    std::lock_guard<std::mutex> l(rename_mu_);
    if (!cache_->IsCurrent(job)) {
      s = Status::Aborted("superseded by a newer version");
    } else {
      s = env_->RenameFile(tmp, job.path);
    }
  }
  if (!s.ok()) {
    Status ignored = env_->RemoveFile(tmp);
    (void)ignored;
    return s;
  }
  *records = crcs.records();
  *crc_fields = crcs.Fields();
  return env_->SyncDir(dir);
}

}  // namespace tce
