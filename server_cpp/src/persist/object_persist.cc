// Persister: files under object storage roots. The buffer's CRCs are
// patched in one pass (yielding to saves in flight, as file writes do), then
// the whole buffer goes to the store as one object: the store makes it
// visible only complete, and only after the last check here (the version is
// still current; the key holds what the save found, or what this server
// wrote last). Failures are retried with backoff like file writes; the store
// retries each request itself first (throttling, 5xx, timeouts).
#include <sys/mman.h>

#include <algorithm>
#include <cerrno>

#include "common/logging.h"
#include "persist/persister.h"

namespace tce {

Status Persister::PersistObject(const PersistJob& job, const ObjectRoot& root, const std::string& key,
                                std::vector<Record>* records, FileStat* written) {
  Status s = ValidateZipTable(job.fd, job.size, *records);
  if (!s.ok()) return Status::InvalidArgument("the record table does not match the file: " + s.message());
  const uint64_t mapped = std::max<uint64_t>(job.size, 1);
  void* map = mmap(nullptr, mapped, PROT_READ | PROT_WRITE, MAP_SHARED, job.fd, 0);
  if (map == MAP_FAILED) return Status::FromErrno(errno, "mmap buffer " + std::to_string(job.buffer_id));
  auto* data = static_cast<unsigned char*>(map);
  ZipCrcStream crcs(*records, job.size, /*patch=*/job.zip_crc32);
  // The CRCs are computed (and patched in) as the parts go: the bytes below
  // `end` before the part that ends there is sent. A CRC patch only lands at
  // or after the bytes fed, so no part already sent is touched again.
  Mutex crc_mu;
  std::chrono::milliseconds yielded(0);
  auto prepare = [&](uint64_t end) {
    MutexLock l(&crc_mu);
    if (crcs.fed() >= end) return;
    if (yielded < options_.max_yield) yielded += cache_->WaitForNoSaves(options_.max_yield - yielded);
    const uint64_t from = crcs.fed();
    crcs.Feed(from, data + from, static_cast<size_t>(std::min(end, job.size) - from));
  };
  ObjectStore* store = root.store.get();
  const std::string url = store->Url(key);
  // The last look before the object becomes visible (no lock is held across
  // the store's commit: S3 has no rename to order against; a save of the
  // same path meanwhile writes its own version after this one).
  auto before_commit = [&]() -> Status {
    if (!cache_->IsCurrent(job)) return Status::Aborted("superseded by a newer version");
    if (!job.expected.known) return Status::OK();
    ObjectId now;
    Status st = store->Stat(key, &now);
    if (!st.ok()) return Status::Unavailable("cannot check " + url + " before writing it: " + st.message());
    StorageCheck c = CompareObject(url, job.expected, now);
    if (c.verdict == Verdict::kChanged) return Status::Cancelled(c.why);
    return Status::OK();
  };
  ObjectId out;
  for (int attempt = 0;; ++attempt) {
    s = store->Write(key, reinterpret_cast<const char*>(data), job.size, before_commit, &out, prepare);
    if (s.ok() || s.code() == Status::Code::kAborted || s.code() == Status::Code::kCancelled ||
        s.code() == Status::Code::kPermissionDenied || s.code() == Status::Code::kInvalidArgument)
      break;  // done, or a retry cannot help (the store retried what can clear)
    if (options_.metrics) options_.metrics->Failed();
    if (attempt >= options_.retries) break;
    auto delay = options_.backoff * (1 << std::min(attempt, 10));
    TCE_LOG(kWarning, "persist") << "retrying " << url << " (path=" << job.path << ") in " << delay.count()
                                 << "ms (attempt " << attempt + 1 << " of " << options_.retries
                                 << "): " << s.ToString();
    if (!SleepUnlessStopping(delay)) break;
  }
  prepare(job.size);  // every CRC, even when the write failed before the end (a retry resumes)
  *records = crcs.records();
  munmap(map, mapped);
  if (s.ok()) {
    *written = FileStat();
    written->size = out.size;
    written->etag = out.etag;
    written->mode = 0100644;
  }
  return s;
}

}  // namespace tce
