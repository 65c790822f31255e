#include "ring/replicator.h"

#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>

#include "common/logging.h"
#include "persist/crc.h"
#include "tce/v1/tce.pb.h"

namespace tce {

Replicator::Replicator(Cache* cache, Transport* transport, ReplicatorOptions options)
    : cache_(cache), transport_(transport), options_(std::move(options)) {}

Replicator::~Replicator() { Stop(); }

void Replicator::Start() {
  for (int i = 0; i < options_.threads; ++i) threads_.emplace_back([this] { Loop(); });
}

void Replicator::Stop() {
  {
    std::lock_guard<std::mutex> l(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  cache_->StopBackups();
  for (auto& t : threads_) t.join();
  threads_.clear();
}

bool Replicator::SleepUnlessStopping(std::chrono::milliseconds d) {
  std::unique_lock<std::mutex> l(mu_);
  return !cv_.wait_for(l, d, [this] { return stop_; });
}

void Replicator::Loop() {
  std::map<std::string, std::unique_ptr<PeerLink>> links;  // this thread's, by peer
  auto backoff = options_.backoff;
  BackupJob job;
  while (cache_->NextBackupJob(&job)) {
    auto t0 = std::chrono::steady_clock::now();
    Status s = Send(job, &links);
    if (job.fd >= 0) ::close(job.fd);
    cache_->FinishBackup(job, s);
    if (s.ok()) {
      backoff = options_.backoff;
      if (!job.drop) {
        double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        TCE_LOG(kInfo, "ring") << "backed up job=" << job.job << " path=" << job.path << " to "
                               << job.peer << " size=" << job.size << " MBps="
                               << (secs > 0 ? job.size / secs / 1e6 : 0);
      }
      continue;
    }
    links.erase(job.peer);  // re-made on the next attempt
    TCE_LOG(kWarning, "ring") << (job.drop ? "drop" : "backup") << " of " << job.path << " to "
                              << job.peer << " failed, retrying in " << backoff.count()
                              << "ms: " << s.ToString();
    if (!SleepUnlessStopping(backoff)) break;
    backoff = std::min(backoff * 2, options_.max_backoff);
  }
}

Status Replicator::Send(const BackupJob& job, std::map<std::string, std::unique_ptr<PeerLink>>* links) {
  std::unique_ptr<PeerLink>& link = (*links)[job.peer];
  Status s;
  if (!link) {
    s = PeerLink::Connect(job.peer, options_.self, options_.token, options_.io_timeout, &link);
    if (!s.ok()) return s;
  }
  v1::PeerRequest req;
  if (job.drop) {
    v1::PeerDrop* d = req.mutable_drop();
    d->set_job(job.job);
    d->set_path(job.path);
    d->set_version(job.version);
    s = link->Send(req);
  } else {
    // CRCs travel with the header; where persistence has not computed them
    // yet, compute them from a read-only mapping (the buffer is pinned).
    std::vector<Record> records = job.records;
    bool missing = false;
    for (const Record& r : records) missing |= r.crc32 == 0 && r.size > 0;
    if (missing && job.size > 0) {
      void* map = mmap(nullptr, job.size, PROT_READ, MAP_SHARED, job.fd, 0);
      if (map == MAP_FAILED) return Status::FromErrno(errno, "mmap buffer for backup");
      for (Record& r : records)
        r.crc32 = Crc32(0, static_cast<const unsigned char*>(map) + r.data_offset, static_cast<size_t>(r.size));
      munmap(map, job.size);
    }
    v1::PeerBackup* b = req.mutable_backup();
    b->set_job(job.job);
    b->set_tag(job.tag);
    b->set_rank(job.rank);
    b->set_path(job.path);
    b->set_size(job.size);
    b->set_version(job.version);
    for (const Record& r : records) {
      v1::Record* p = b->add_records();
      p->set_name(r.name);
      p->set_header_offset(r.header_offset);
      p->set_data_offset(r.data_offset);
      p->set_size(r.size);
      p->set_crc32(r.crc32);
      p->set_central_offset(r.central_offset);
    }
    s = link->Send(req);
    if (s.ok()) s = transport_->SendData(link.get(), job.fd, job.size);
  }
  if (!s.ok()) return s;
  v1::PeerReply reply;
  s = link->Recv(&reply);
  if (!s.ok()) return s;
  if (reply.code() != 0)
    return Status::FromCode(static_cast<Status::Code>(reply.code()), "peer " + job.peer + ": " + reply.message());
  return Status::OK();
}

}  // namespace tce
