// Replicator: its threads, the links they keep, and what they send (a copy,
// a tag, a drop, a persisted notice). Copies pulled back: replicator_recovery.cc.
#include "ring/replicator.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <variant>

#include "cache/record_proto.h"
#include "cache/tag_proto.h"
#include "common/logging.h"
#include "persist/crc.h"
#include "tce/v1/tce.pb.h"

namespace tce {
namespace {
// After this many failed attempts a restore no longer holds loads up.
constexpr int kRecoverFailuresBeforeLoadsGoOn = 3;
// Attempts at telling a holder what the owner persisted (PeerPersisted).
constexpr int kPersistedNoticeAttempts = 5;

TagBarrierOptions BarrierOptions(const ReplicatorOptions& o) {
  TagBarrierOptions b;
  b.self = o.self;
  b.key = o.key;
  b.interval = o.marker_interval;
  b.io_timeout = o.io_timeout;
  b.breaker = o.breaker;
  b.clock = o.clock;
  return b;
}
}  // namespace

Replicator::Replicator(RingStores stores, BackupQueue* queue, Transport* transport, ReplicatorOptions options)
    : cache_(stores.ring),
      members_(stores.members),
      backups_(stores.backups),
      recovery_(stores.recovery),
      loads_(stores.loads),
      restores_(stores.restores),
      queue_(queue),
      transport_(transport),
      options_(std::move(options)),
      progress_(options_.clock),
      barrier_(stores.ring, stores.members, BarrierOptions(options_)),
      plans_([loads = stores.loads](const std::string& job, const std::string& dir,
                                    std::vector<ListedObject>* out) { return loads->ListStorageDir(job, dir, out); },
             options_.clock),
      prefetch_log_(10, std::chrono::seconds(10), options_.clock) {}

Replicator::~Replicator() { Stop(); }

void Replicator::Start() {
  for (int i = 0; i < options_.threads; ++i) threads_.emplace_back([this] { Loop(); });
  if (options_.prefetch && options_.cooperative)
    for (int i = 0; i < kPrefetchThreads; ++i) threads_.emplace_back([this] { PrefetchLoop(); });
  barrier_.Start();
}

void Replicator::Stop() {
  {
    MutexLock l(&mu_);
    stop_ = true;
  }
  cv_.SignalAll();
  queue_->Stop();
  prefetches_.Stop();
  barrier_.Stop();
  for (auto& t : threads_) t.join();
  threads_.clear();
}

bool Replicator::SleepUnlessStopping(std::chrono::milliseconds d) {
  const auto deadline = options_.clock->Now() + d;
  MutexLock l(&mu_);
  while (!stop_ && options_.clock->WaitUntil(&cv_, &mu_, deadline)) {
  }
  return !stop_;
}

void Replicator::Loop() {
  std::map<std::string, std::unique_ptr<PeerLink>> links;  // this thread's, by peer
  auto backoff = options_.backoff;
  BackupQueue::Job next;
  while (queue_->Next(&next)) {
    Status s;
    std::string what, peer, predecessor;  // for the log, and the links to re-make
    if (const FileKey* key = std::get_if<FileKey>(&next)) {
      BackupJob job;
      if (!backups_->StartBackup(*key, &job)) continue;
      const Stopwatch took(options_.clock);
      s = Backup(job, &links);
      if (job.fd >= 0) ::close(job.fd);
      backups_->FinishBackup(job, s);  // a failure is queued again
      if (s.ok()) {
        const double secs = took.Seconds();
        if (options_.metrics) options_.metrics->Succeeded(job.size, secs);
        TCE_LOG(kInfo, "ring") << "backed up job=" << job.job << " path=" << job.path << " to "
                               << job.peer << " size=" << job.size << " MBps="
                               << (secs > 0 ? job.size / secs / 1e6 : 0);
      }
      what = "backup of " + job.path;
      peer = job.peer;
    } else if (const TagCopy* copy = std::get_if<TagCopy>(&next)) {
      TagInfo tag;
      int32_t node = 0;
      if (!backups_->StartTagBackup(*copy, &tag, &peer, &node)) continue;
      s = SendTag(tag, node, peer, &links);
      if (s.ok()) {
        TCE_LOG(kInfo, "ring") << "backed up tag job=" << tag.job << " tag=" << tag.tag << " to " << peer;
      } else {  // again, after the backoff (to whoever is the successor then)
        backups_->NoteBackupError("tag " + tag.tag + " to " + peer + ": " + s.ToString());
        queue_->SendTag(*copy);
      }
      what = "backup of tag " + copy->tag;
    } else if (const PersistedCopy* persisted = std::get_if<PersistedCopy>(&next)) {
      // Retried a few times; a holder that never hears it keeps what storage
      // held before the save, and a copy pulled back then defers to storage.
      s = NotePersisted(*persisted, &links);
      if (!s.ok() && persisted->failures + 1 < kPersistedNoticeAttempts) {
        PersistedCopy again = *persisted;
        ++again.failures;
        queue_->Persisted(std::move(again));
      }
      what = "persisted identity of " + persisted->path;
      peer = persisted->peer;
    } else if (const DropCopy* drop = std::get_if<DropCopy>(&next)) {
      s = Drop(*drop, &links);
      // A drop that failed leaves a stale copy; the holder replaces it with the next version.
      if (!s.ok()) backups_->NoteBackupError(s.ToString());
      what = "drop of " + drop->path;
      peer = drop->peer;
    } else {
      const RecoverJob& recover = std::get<RecoverJob>(next);
      const std::vector<std::string> peers = members_->RingPeers(recover.job);
      if (peers.empty() || peers.front() != recover.peer) {
        // The job's ring changed: what it holds now is the new successor's
        // to give back; retrying here would hold every backup behind it.
        TCE_LOG(kInfo, "ring") << "the restore of job=" << recover.job << " from " << recover.peer
                               << " ends: that peer is no longer the job's successor here";
        restores_->End(recover.job, recover.peer);
        continue;
      }
      s = Recover(recover, &links);
      if (!s.ok()) {  // again, after the backoff
        backups_->NoteBackupError("recovery from " + recover.peer + ": " + s.ToString());
        RecoverJob again = recover;
        if (++again.failures == kRecoverFailuresBeforeLoadsGoOn) {
          // The successor may be gone for good: loads stop waiting for a
          // restore that may never come (it goes on in the background).
          TCE_LOG(kWarning, "ring") << "the restore of job=" << recover.job << " from " << recover.peer
                                    << " failed " << again.failures << " times (" << s.ToString()
                                    << "): loads no longer wait for it; it is retried in the background";
          restores_->End(recover.job, recover.peer);
        }
        queue_->Recover(again);
      }
      what = "recovery of " + recover.job;
      peer = recover.peer;
      predecessor = recover.predecessor;
    }
    backups_->NoteRingAttempt(s, what + " with " + peer);
    if (s.ok()) {
      backoff = options_.backoff;
      continue;
    }
    for (const std::string& p : {peer, predecessor}) {  // re-made on the next attempt
      auto it = links.find(p);
      if (it == links.end()) continue;
      it->second->Abort();
      links.erase(it);
    }
    TCE_LOG(kWarning, "ring") << what << " with " << peer << " failed, retrying in "
                              << backoff.count() << "ms: " << s.ToString();
    if (!SleepUnlessStopping(backoff)) break;
    backoff = std::min(backoff * 2, options_.max_backoff);
  }
}

Status Replicator::Link(const std::string& peer,
                        std::map<std::string, std::unique_ptr<PeerLink>>* links, PeerLink** out) {
  std::unique_ptr<PeerLink>& link = (*links)[peer];
  if (!link) {
    Status s = Connect(peer, &link);
    if (!s.ok()) {
      links->erase(peer);
      return s;
    }
  }
  *out = link.get();
  return Status::OK();
}

Status Replicator::Connect(const std::string& peer, std::unique_ptr<PeerLink>* out, Clock::TimePoint deadline) {
  const auto timeout = std::max(std::chrono::milliseconds(1),
                                std::min(options_.io_timeout, options_.clock->Left(deadline)));
  std::unique_ptr<PeerLink> link;
  Status s = PeerLink::Connect(peer, options_.self, options_.key, timeout, &link, options_.breaker);
  if (s.ok() && transport_->lanes() > 1)
    s = OpenLanes(link.get(), peer, options_.self, options_.key, timeout, transport_->lanes(), options_.breaker);
  if (s.ok() && timeout != options_.io_timeout) link->SetIoTimeout(options_.io_timeout);  // up by the deadline
  if (s.ok()) *out = std::move(link);
  return s;
}

Status Replicator::SendWithChecksums(PeerLink* link, const BackupJob& job) {
  void* map = nullptr;
  const unsigned char* data = job.data;
  if (!data && job.size > 0) {  // no kept mapping: a private one for this backup
    map = mmap(nullptr, job.size, PROT_READ, MAP_SHARED, job.fd, 0);
    if (map == MAP_FAILED) return Status::FromErrno(errno, "mmap buffer for backup");
    data = static_cast<const unsigned char*>(map);
  }
  // Each chunk is checksummed just before it goes, while cache-hot.
  RecordCrcs crcs(job.records);
  Status s = transport_->Send(link, SendSource{job.fd, job.size},
                              [&](uint64_t off, uint64_t n) { crcs.Feed(off, data + off, static_cast<size_t>(n)); });
  if (map) munmap(map, job.size);
  if (!s.ok()) return s;
  v1::PeerChecksums trailer;
  for (uint32_t c : crcs.crcs()) trailer.add_crc32(c);
  return link->Send(trailer);
}

Status Replicator::SendTag(const TagInfo& tag, int32_t node, const std::string& peer,
                           std::map<std::string, std::unique_ptr<PeerLink>>* links) {
  v1::PeerRequest req;
  TagToProto(tag, req.mutable_tag()->mutable_tag());
  req.mutable_tag()->set_owner_node(node);
  uid_t uid = 0;
  if (members_->JobUid(tag.job, &uid)) req.mutable_tag()->set_job_uid(uid);
  return Ask(peer, req, links);
}

Status Replicator::Drop(const DropCopy& drop, std::map<std::string, std::unique_ptr<PeerLink>>* links) {
  v1::PeerRequest req;
  v1::PeerDrop* d = req.mutable_drop();
  d->set_job(drop.job);
  d->set_path(drop.path);
  d->set_version(drop.version);
  return Ask(drop.peer, req, links);
}

Status Replicator::NotePersisted(const PersistedCopy& copy,
                                 std::map<std::string, std::unique_ptr<PeerLink>>* links) {
  v1::PeerRequest req;
  v1::PeerPersisted* p = req.mutable_persisted();
  p->set_job(copy.job);
  p->set_path(copy.path);
  p->set_version(copy.version);
  DiskToProto(copy.disk, p->mutable_storage());
  return Ask(copy.peer, req, links);
}

Status Replicator::Ask(const std::string& peer, const v1::PeerRequest& req,
                       std::map<std::string, std::unique_ptr<PeerLink>>* links) {
  PeerLink* link = nullptr;
  Status s = Link(peer, links, &link);
  if (!s.ok()) return s;
  if (!(s = link->Send(req)).ok()) return s;
  return Verdict(link, peer);
}

Status Replicator::Backup(const BackupJob& job, std::map<std::string, std::unique_ptr<PeerLink>>* links) {
  PeerLink* link = nullptr;
  Status s = Link(job.peer, links, &link);
  if (!s.ok()) return s;
  // CRCs travel with the header when persistence computed them already;
  // otherwise each chunk is checksummed just before it is sent (the pass
  // overlaps the transfer) and the CRCs follow the bytes.
  // A file with no records (not a torch zip) goes with byte ranges to check.
  const bool ranges = job.records.empty() && job.size > 0;
  BackupJob with_ranges;
  if (ranges) {
    with_ranges = job;
    with_ranges.records = CheckRanges(job.size);
  }
  const BackupJob& sent = ranges ? with_ranges : job;
  const std::vector<Record>& records = sent.records;
  bool missing = false;
  for (const Record& r : records) missing |= r.crc32 == 0 && r.size > 0;
  v1::PeerRequest req;
  v1::PeerBackup* b = req.mutable_backup();
  b->set_crc_trailer(missing);
  b->set_check_ranges(ranges);
  b->set_job(job.job);
  b->set_tag(job.tag);
  b->set_rank(job.rank);
  b->set_path(job.path);
  b->set_size(job.size);
  b->set_version(job.version);
  b->set_owner_node(job.node);
  uid_t uid = 0;
  if (members_->JobUid(job.job, &uid)) b->set_job_uid(uid);
  RecordsToProto(records, b->mutable_records());
  if (job.disk.known) DiskToProto(job.disk, b->mutable_storage());
  s = link->Send(req);
  if (s.ok() && !missing) s = transport_->Send(link, SendSource{job.fd, job.size}, nullptr);
  if (s.ok() && missing) s = SendWithChecksums(link, sent);
  if (!s.ok()) return s;
  return Verdict(link, job.peer);
}

Status Replicator::Verdict(PeerLink* link, const std::string& peer) {
  v1::PeerReply reply;
  Status s = link->Recv(&reply);
  if (!s.ok()) return s;
  if (reply.code() != 0)
    return Status::FromCode(static_cast<Status::Code>(reply.code()), "peer " + peer + ": " + reply.message());
  return Status::OK();
}

}  // namespace tce
