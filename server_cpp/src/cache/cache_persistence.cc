// Cache: the files' side of persistence (cache/persistence.h). Committed
// files are queued through Persistence; its workers' steps (the current
// version pinned, the outcome recorded) are PersistSide's, each under the
// Cache's lock; failures that may clear are retried, and Wait blocks until
// files are on storage.
#include "cache/cache.h"

#include "common/clock.h"
#include "common/logging.h"

namespace tce {

Status Cache::Wait(const std::string& session, const std::string& job,
                   const std::vector<std::string>& paths, std::chrono::milliseconds timeout,
                   std::vector<FileInfo>* out, const CallerGone& gone) {
  MutexLock lock(&mu_);
  Status s = CheckAccess(session, job, "wait for files of job '" + job + "'");
  if (!s.ok()) return s;
  if (!persistence_enabled())
    return Status::FailedPrecondition(
        "persistence is off (the server has no storage_roots): files live in memory only");
  const auto deadline = timeout.count() <= 0 ? Clock::TimePoint::max() : clock_->Now() + timeout;
  while (true) {
    out->clear();
    std::vector<std::string> unfinished;
    for (const std::string& path : paths) {
      auto it = files_.find({job, path});
      if (it == files_.end()) return Status::NotFound(path + " is not cached for job " + job);
      if (it->second.state == FileState::kCached || it->second.state == FileState::kBackedUp)
        unfinished.push_back(path);
      out->push_back(it->second);
    }
    if (unfinished.empty()) return Status::OK();
    if (stopping_) return Status::Unavailable("the server is shutting down");
    if (!(s = sessions_.Check(session)).ok()) return s;  // the session closed meanwhile
    if (!BlockedWait(&done_cv_, deadline, gone, &s)) {
      if (!s.ok()) return s;
      return Status::DeadlineExceeded(std::to_string(unfinished.size()) + " of " + std::to_string(paths.size()) +
                                      " file(s) not persisted yet, e.g. " + unfinished[0]);
    }
  }
}

bool Cache::BlockedWait(CondVar* cv, Clock::TimePoint deadline, const CallerGone& gone, Status* status) {
  if (gone && gone()) {
    *status = Status::Cancelled("the caller went away");
    return false;
  }
  Clock::TimePoint until = deadline;
  if (gone) until = std::min(deadline, clock_->Now() + kCallerGonePoll);
  if (until == Clock::TimePoint::max()) {
    cv->Wait(&mu_);
    return true;
  }
  clock_->WaitUntil(cv, &mu_, until);
  if (gone && gone()) {
    *status = Status::Cancelled("the caller went away");
    return false;
  }
  return clock_->Now() < deadline;
}

void Cache::QueuePersist(const FileKey& key) { persistence_->Queue(key); }

bool Cache::AwaitingPersistence() const {
  // A committed file not yet on storage (and not FAILED) is queued, taken by
  // a worker that has not started it yet, or being written: either way its
  // persistence will end and wake the waiters. Persistence's queue and
  // files in flight alone miss the moment between a worker's taking a file and starting it.
  for (const auto& [key, f] : files_)
    if (f.buffer_id != 0 && (f.state == FileState::kCached || f.state == FileState::kBackedUp)) return true;
  return false;
}

void Cache::FailPersist(FileInfo& f, const Status& why) {
  f.state = FileState::kFailed;
  f.reason = why.ToString();
  if (f.buffer_id != 0) f.reason += persistence_->ScheduleRetry({f.job, f.path}, why);
  Note(f, false);
  done_cv_.SignalAll();
}

void Cache::Reopen(FileInfo& f) {
  TCE_LOG(kInfo, "persist") << "persisting again job=" << f.job << " path=" << f.path
                            << " (failed: " << f.reason << ")";
  f.state = f.backup_holder.empty() ? FileState::kCached : FileState::kBackedUp;
  f.reason.clear();
  Note(f, false);
}

void Cache::Requeue(FileInfo& f) {
  persistence_->CancelRetry({f.job, f.path});
  Reopen(f);
  QueuePersist({f.job, f.path});
}

Status Cache::RetryFailed(const std::string& session, const std::string& job,
                          const std::vector<std::string>& paths, std::vector<FileInfo>* out) {
  MutexLock lock(&mu_);
  if (job.empty()) return Status::InvalidArgument("retry needs a job");
  Status s = CheckAccess(session, job, "retry files of job '" + job + "'");
  if (!s.ok()) return s;
  if (!persistence_enabled())
    return Status::FailedPrecondition("this server persists nothing (no storage_roots)");
  std::vector<FileInfo*> chosen;
  if (paths.empty()) {
    for (auto& [key, f] : files_)
      if (key.first == job && f.state == FileState::kFailed && f.buffer_id != 0) chosen.push_back(&f);
  }
  for (const std::string& path : paths) {
    auto it = files_.find({job, path});
    if (it == files_.end()) return Status::NotFound("no file " + path + " in job " + job);
    FileInfo& f = it->second;
    if (f.state != FileState::kFailed)
      return Status::FailedPrecondition(path + " is " + FileStateName(f.state) + ", not FAILED: nothing to retry");
    if (f.buffer_id == 0)
      return Status::FailedPrecondition(path + " is no longer in memory (" + f.reason +
                                        "): only a new save can bring it back");
    chosen.push_back(&f);
  }
  for (FileInfo* f : chosen) {
    Requeue(*f);
    out->push_back(*f);
  }
  return Status::OK();
}

bool Cache::PinCurrent(const FileKey& key, bool retry, PersistJob* out) {
  MutexLock lock(&mu_);
  if (stopping_) return false;
  auto it = files_.find(key);
  if (it == files_.end()) return false;  // removed
  FileInfo& f = it->second;
  if (retry) {  // a scheduled attempt: only at a file still FAILED with its memory
    if (f.state != FileState::kFailed || f.buffer_id == 0) return false;
    Reopen(f);
  }
  if (f.state != FileState::kCached && f.state != FileState::kBackedUp) return false;  // gone or done
  if (persistence_->InFlightAt(key, f.version)) return false;
  if (MarkerMustWait(key, f)) {  // queued again once the tag's other files are durable
    waiting_markers_.insert(key);
    return false;
  }
  Buf& buf = buffers_[f.buffer_id];
  int fd = -1;
  Status s = buf.mem->NewFd(/*writable=*/true, &fd);
  if (!s.ok()) {  // e.g. out of descriptors: that clears
    FailPersist(f, s);
    return false;
  }
  ++buf.pins;
  persistence_->TakeOff(key, f.version);
  out->job = key.first;
  out->path = key.second;
  out->version = f.version;
  out->buffer_id = buf.id;
  out->size = f.size;
  out->capacity = buf.capacity;
  out->uid = f.owner_uid;
  out->gid = f.owner_gid;
  out->new_mode = f.new_mode;
  out->zip_crc32 = f.zip_crc32;
  out->expected = f.disk;
  out->records = f.records;
  out->fd = fd;
  return true;
}

std::chrono::milliseconds Cache::WaitForNoSaves(std::chrono::milliseconds max) {
  MutexLock lock(&mu_);
  auto saving = [this]() REQUIRES(mu_) { return (!pending_.empty() || starting_ > 0) && !stopping_; };
  if (!saving()) return std::chrono::milliseconds(0);
  const Stopwatch waited(clock_);
  const auto deadline = clock_->Now() + max;
  while (saving() && clock_->WaitUntil(&quiet_cv_, &mu_, deadline)) {
  }
  return waited.Millis();
}

bool Cache::IsCurrentVersion(const PersistJob& job) {
  MutexLock lock(&mu_);
  auto it = files_.find({job.job, job.path});
  return it != files_.end() && it->second.version == job.version;
}

void Cache::RecordPersisted(const PersistJob& job, const Status& result, std::vector<Record> records,
                            const FileStat& written) {
  MutexLock lock(&mu_);
  auto b = buffers_.find(job.buffer_id);
  if (b != buffers_.end()) {
    --b->second.pins;
    MaybeFree(b->second);
  }
  persistence_->Land({job.job, job.path}, job.version);
  auto it = files_.find({job.job, job.path});
  if (it != files_.end() && it->second.version != job.version && result.ok() &&
      it->second.disk.known && job.expected.known) {
    // Superseded as it was renamed into place: the newer version must
    // expect the file this one left.
    it->second.disk = Written(job.expected, written);
    return;
  }
  if (it == files_.end() || it->second.version != job.version) return;  // superseded
  if (result.code() == Status::Code::kCancelled) {
    Discard(it->second, result.message());
  } else if (result.ok()) {
    it->second.disk = Written(job.expected, written);
    it->second.state = FileState::kPersisted;
    it->second.persisted_unix_ns = clock_->UnixNowNs();
    it->second.records = std::move(records);
    backups_->TellPersisted(it->second);
    persistence_->CountWritten(job.path, job.size);
    Note(it->second, false);
    EnforceKeepLast(job.job);
    if (!waiting_markers_.empty()) ReleaseMarkers(job.job);
  } else {
    FailPersist(it->second, result);
  }
  done_cv_.SignalAll();
}

void Cache::EndPersistence() {
  MutexLock lock(&mu_);
  stopping_ = true;
  done_cv_.SignalAll();
  quiet_cv_.SignalAll();
}

class Cache::PersistSide : public PersistHost {
 public:
  explicit PersistSide(Cache* cache) : c_(cache) {}
  bool PinCurrent(const FileKey& key, bool retry, PersistJob* out) override {
    return c_->PinCurrent(key, retry, out);
  }
  bool IsCurrent(const PersistJob& job) override { return c_->IsCurrentVersion(job); }
  std::chrono::milliseconds WaitForNoSaves(std::chrono::milliseconds max) override {
    return c_->WaitForNoSaves(max);
  }
  void Record(const PersistJob& job, const Status& result, std::vector<tce::Record> records,
              const FileStat& written) override {
    c_->RecordPersisted(job, result, std::move(records), written);
  }
  void StopPersistence() override { c_->EndPersistence(); }
  std::vector<TagInfo> CompleteTags(const std::string& job) override { return c_->ListTags(job); }
  void ForgetTag(const std::string& job, const std::string& tag) override { c_->ForgetTag(job, tag); }
  Requester JobRequester(const std::string& job) override { return c_->JobRequester(job); }

 private:
  Cache* const c_;
};

std::unique_ptr<PersistHost> Cache::MakePersistSide() { return std::make_unique<PersistSide>(this); }

}  // namespace tce
