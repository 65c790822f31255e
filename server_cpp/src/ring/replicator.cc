#include "ring/replicator.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <set>
#include <variant>

#include "cache/record_proto.h"
#include "cache/tag_proto.h"
#include "cache/tag_registry.h"
#include "common/logging.h"
#include "persist/crc.h"
#include "ring/backup_store.h"
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

Replicator::Replicator(RingStores stores, Transport* transport, ReplicatorOptions options)
    : cache_(stores.ring),
      recovery_(stores.recovery),
      transport_(transport),
      options_(std::move(options)),
      barrier_(stores.ring, BarrierOptions(options_)),
      plans_([recovery = stores.recovery](const std::string& job, const std::string& dir,
                                          std::vector<ListedObject>* out) {
        return recovery->ListStorageDir(job, dir, out);
      },
             options_.clock),
      prefetch_log_(10, std::chrono::seconds(10), options_.clock) {
  cache_->SetBackupFeed(&queue_);
}

Replicator::~Replicator() {
  Stop();
  cache_->SetBackupFeed(nullptr);
}

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
  queue_.Stop();
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
  while (queue_.Next(&next)) {
    Status s;
    std::string what, peer, predecessor;  // for the log, and the links to re-make
    if (const FileKey* key = std::get_if<FileKey>(&next)) {
      BackupJob job;
      if (!cache_->StartBackup(*key, &job)) continue;
      const Stopwatch took(options_.clock);
      s = Backup(job, &links);
      if (job.fd >= 0) ::close(job.fd);
      cache_->FinishBackup(job, s);  // a failure is queued again
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
      if (!cache_->StartTagBackup(*copy, &tag, &peer, &node)) continue;
      s = SendTag(tag, node, peer, &links);
      if (s.ok()) {
        TCE_LOG(kInfo, "ring") << "backed up tag job=" << tag.job << " tag=" << tag.tag << " to " << peer;
      } else {  // again, after the backoff (to whoever is the successor then)
        cache_->NoteBackupError("tag " + tag.tag + " to " + peer + ": " + s.ToString());
        queue_.SendTag(*copy);
      }
      what = "backup of tag " + copy->tag;
    } else if (const PersistedCopy* persisted = std::get_if<PersistedCopy>(&next)) {
      // Retried a few times; a holder that never hears it keeps what storage
      // held before the save, and a copy pulled back then defers to storage.
      s = NotePersisted(*persisted, &links);
      if (!s.ok() && persisted->failures + 1 < kPersistedNoticeAttempts) {
        PersistedCopy again = *persisted;
        ++again.failures;
        queue_.Persisted(std::move(again));
      }
      what = "persisted identity of " + persisted->path;
      peer = persisted->peer;
    } else if (const DropCopy* drop = std::get_if<DropCopy>(&next)) {
      s = Drop(*drop, &links);
      // A drop that failed leaves a stale copy; the holder replaces it with the next version.
      if (!s.ok()) cache_->NoteBackupError(s.ToString());
      what = "drop of " + drop->path;
      peer = drop->peer;
    } else {
      const RecoverJob& recover = std::get<RecoverJob>(next);
      const std::vector<std::string> peers = cache_->RingPeers(recover.job);
      if (peers.empty() || peers.front() != recover.peer) {
        // The job's ring changed: what it holds now is the new successor's
        // to give back; retrying here would hold every backup behind it.
        TCE_LOG(kInfo, "ring") << "the restore of job=" << recover.job << " from " << recover.peer
                               << " ends: that peer is no longer the job's successor here";
        recovery_->RestoreEnded(recover.job, recover.peer);
        continue;
      }
      s = Recover(recover, &links);
      if (!s.ok()) {  // again, after the backoff
        cache_->NoteBackupError("recovery from " + recover.peer + ": " + s.ToString());
        RecoverJob again = recover;
        if (++again.failures == kRecoverFailuresBeforeLoadsGoOn) {
          // The successor may be gone for good: loads stop waiting for a
          // restore that may never come (it goes on in the background).
          TCE_LOG(kWarning, "ring") << "the restore of job=" << recover.job << " from " << recover.peer
                                    << " failed " << again.failures << " times (" << s.ToString()
                                    << "): loads no longer wait for it; it is retried in the background";
          recovery_->RestoreEnded(recover.job, recover.peer);
        }
        queue_.Recover(again);
      }
      what = "recovery of " + recover.job;
      peer = recover.peer;
      predecessor = recover.predecessor;
    }
    cache_->NoteRingAttempt(s, what + " with " + peer);
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

Status Replicator::Recover(const RecoverJob& job, std::map<std::string, std::unique_ptr<PeerLink>>* links) {
  PeerLink* link = nullptr;
  Status s = Link(job.peer, links, &link);
  if (!s.ok()) return s;
  v1::PeerRequest req;
  req.mutable_list()->set_job(job.job);
  req.mutable_list()->set_owner_node(job.node);
  uid_t uid = 0;
  if (cache_->JobUid(job.job, &uid)) req.mutable_list()->set_job_uid(uid);
  v1::PeerListReply list;
  if (!(s = link->Send(req)).ok() || !(s = link->Recv(&list)).ok()) return s;
  if (list.code() != 0)  // e.g. the holder has not been told the ring we are in yet: retried
    return Status::Unavailable("peer " + job.peer + " refused the list of job " + job.job + ": " +
                               list.message().substr(0, 1024));
  TCE_LOG(kInfo, "ring") << "recovering job=" << job.job << ": " << list.files_size()
                         << " file(s) and " << list.tags_size() << " tag(s) held by " << job.peer;
  // The tags are checked now and kept once the files are back: a tag is
  // listed again only if every file it names is (see CheckRecoveredTag).
  std::vector<TagInfo> tags;
  for (int i = 0; i < list.tags_size(); ++i) {
    TagInfo tag = TagFromProto(list.tags(i));
    Status bad = CheckTag(list.tags(i), "tags[" + std::to_string(i) + "]");
    if (bad.ok()) {
      const std::string why = TagRegistry::Check(&tag);
      if (!why.empty()) bad = Status::InvalidArgument(why);
      else if (tag.job != job.job) bad = Status::PermissionDenied("a tag of job " + tag.job + ", not " + job.job);
      else if (tag.complete_unix_ns <= 0) bad = Status::InvalidArgument("tag " + tag.tag + " has no completion time");
    }
    if (!bad.ok()) {
      TCE_LOG(kWarning, "ring") << "refused a tag from " << job.peer << ": " << bad.ToString();
      continue;
    }
    tags.push_back(std::move(tag));
  }
  // The newest first (versions grow with every save on the owner): the
  // checkpoint a restarted job loads is back soonest.
  std::vector<const v1::PeerBackup*> order;
  for (const v1::PeerBackup& f : list.files()) order.push_back(&f);
  std::stable_sort(order.begin(), order.end(),
                   [](const v1::PeerBackup* a, const v1::PeerBackup* b) { return a->version() > b->version(); });
  int pulled = 0;
  for (const v1::PeerBackup* file : order) {
    const v1::PeerBackup& f = *file;
    Status p = Pull(link, job.job, job.peer, f.path());
    if (p.code() == Status::Code::kUnavailable) return p;  // the link broke: retry the whole
    if (p.ok()) {
      ++pulled;
    } else {  // this file: storage serves it
      TCE_LOG(kWarning, "ring") << "not recovered job=" << job.job << " path=" << f.path() << ": "
                                << p.ToString();
      cache_->NoteBackupError("recovery of " + f.path() + ": " + p.ToString());
    }
  }
  std::set<std::string> listed;  // this node's files, as the holder listed them
  for (const v1::PeerBackup& f : list.files()) listed.insert(f.path());
  std::vector<TagInfo> sound;
  for (TagInfo& tag : tags) {
    Status bad = recovery_->CheckRecoveredTag(tag, listed);
    if (bad.ok()) sound.push_back(std::move(tag));
    else TCE_LOG(kWarning, "ring") << "not recovered: a tag from " << job.peer << ": " << bad.message();
  }
  if (!sound.empty()) {
    const size_t kept = recovery_->AdoptTags(job.job, std::move(sound));
    TCE_LOG(kInfo, "ring") << "recovered " << kept << " complete tag(s) of job=" << job.job << " from "
                           << job.peer;
  }
  ReportRecovery(job, pulled, list.files_size(), list.own_files());
  recovery_->RestoreEnded(job.job, job.peer);  // loads waiting for the restore go on
  if (job.predecessor.empty() || job.predecessor == options_.self) return Status::OK();
  PeerLink* pred = nullptr;
  if (!(s = Link(job.predecessor, links, &pred)).ok()) return s;
  v1::PeerRequest resync;
  resync.mutable_resync()->set_job(job.job);
  v1::PeerReply reply;
  if (!(s = pred->Send(resync)).ok() || !(s = pred->Recv(&reply)).ok()) return s;
  return Status::OK();
}

void Replicator::ReportRecovery(const RecoverJob& job, int pulled, int listed, uint64_t peer_own) {
  // What metadata says this node held and the ring did not give back.
  const std::vector<FileInfo> missing = recovery_->NotInMemory(job.job);
  if (pulled == listed && missing.empty() && (listed > 0 || peer_own == 0)) {  // all, or a new job
    TCE_LOG(kInfo, "ring") << "recovered " << pulled << " of " << listed << " file(s) of job="
                           << job.job << " from " << job.peer;
    return;
  }
  std::set<std::string> tags;
  for (const FileInfo& f : missing) tags.insert(f.tag.empty() ? "(no tag)" : f.tag);
  std::string named;
  for (const std::string& t : tags) named += (named.empty() ? "" : ", ") + t;
  std::string why;
  if (!missing.empty())
    why = std::to_string(missing.size()) + " file(s) this node held are gone from memory and the ring " +
          "(tags: " + named + "); loads read them from storage, or fail";
  else if (listed == 0)
    why = "the successor holds no copy of node " + std::to_string(job.node) + "'s files, though it holds " +
          std::to_string(peer_own) + " file(s) of the job's checkpoints itself: what this node cached for the "
          "job is gone (no metadata here says which tags); loads read storage, or fail";
  else
    why = std::to_string(listed - pulled) + " file(s) could not be recovered (logged above); loads read "
          "them from storage, or fail";
  TCE_LOG(kWarning, "ring") << "recovered " << pulled << " of " << listed << " file(s) of job=" << job.job
                            << " from " << job.peer << ": " << why;
}

Status Replicator::Pull(PeerLink* link, const std::string& job, const std::string& peer,
                        const std::string& path, PullMode mode, std::string* reader, const std::string& down) {
  v1::PeerRequest req;
  req.mutable_fetch()->set_job(job);
  req.mutable_fetch()->set_path(path);
  req.mutable_fetch()->set_load(mode != PullMode::kCopy);
  req.mutable_fetch()->set_stage(mode == PullMode::kStage);
  req.mutable_fetch()->set_claim(reader != nullptr && mode != PullMode::kCopy);
  if (req.fetch().claim() && !down.empty()) req.mutable_fetch()->add_down(down);
  uid_t uid = 0;
  if (cache_->JobUid(job, &uid)) req.mutable_fetch()->set_job_uid(uid);
  v1::PeerReply reply;
  Status s = link->Send(req);
  do {  // while the peer reads storage for us, it says so (within each timeout)
    if (s.ok()) s = link->Recv(&reply);
  } while (s.ok() && reply.loading() && mode != PullMode::kCopy);
  if (!s.ok()) return s;
  if (reply.code() != 0) {
    Status::Code code = static_cast<Status::Code>(reply.code());
    // The peer answered: its own storage failing is no sign of it down.
    if (mode != PullMode::kCopy && (code == Status::Code::kUnavailable || code == Status::Code::kDeadlineExceeded))
      code = Status::Code::kAborted;
    return Status::FromCode(code, reply.message());
  }
  if (!reply.reader().empty()) {  // another node reads it: a ring member, or nothing
    const std::vector<std::string> nodes = cache_->RingNodes(job);
    if (!reader || std::find(nodes.begin(), nodes.end(), reply.reader()) == nodes.end())
      return Status::DataLoss(peer + " named " + reply.reader().substr(0, 256) + " as the reader of " + path +
                              ", which is no node of job " + job + "'s ring");
    *reader = reply.reader();
    return Status::OK();
  }
  if (mode == PullMode::kStage) return Status::OK();
  v1::PeerBackup header;
  if (!(s = link->Recv(&header)).ok()) return s;
  std::unique_ptr<Buffer> mem;
  Status room;
  if (header.job() != job || header.path() != path)  // a peer answers what it was asked, nothing else
    room = Status::PermissionDenied("peer " + peer + " sent back job=" + header.job().substr(0, 256) +
                                    " path=" + header.path().substr(0, 4096) + " when asked for job=" +
                                    job + " path=" + path);
  if (room.ok()) room = recovery_->ReserveRecovery(header.size(), &mem);
  void* map = MAP_FAILED;
  if (room.ok())
    map = mmap(nullptr, mem->capacity(), PROT_READ | PROT_WRITE, MAP_SHARED, mem->fd(), 0);
  if (!room.ok() || map == MAP_FAILED) {  // take the bytes anyway: the stream stays in step
    if (room.ok()) room = Status::FromErrno(errno, "mmap recovery buffer");
    if (room.code() == Status::Code::kPermissionDenied) {  // out of step: never read what it says follows
      recovery_->AbandonRecovery(std::move(mem));
      return Status::Unavailable(room.message());
    }
    s = transport_->Refuse(link, header.size(), room);
    recovery_->AbandonRecovery(std::move(mem));
    return s.ok() ? room : s;
  }
  // Checksummed as the bytes land, while they are in the CPU's cache.
  std::vector<Record> records = RecordsFromProto(header.records());
  RecordCrcs crcs(records);
  const int fd = mem->backing() == Backing::kHugetlb ? -1 : mem->fd();
  s = transport_->Recv(link, RecvDest{static_cast<unsigned char*>(map), fd}, header.size(),
                       [&](uint64_t off, uint64_t n, const unsigned char* data) {
                         crcs.Feed(off, data, static_cast<size_t>(n));
                       });
  FileInfo f;
  f.job = header.job();
  f.tag = header.tag();
  f.rank = header.rank();
  f.path = header.path();
  f.size = header.size();
  f.backup_holder = peer;
  f.records = std::move(records);
  if (header.has_storage()) f.disk = DiskFromProto(header.storage());
  if (s.ok()) {
    s = CheckRecordBounds(f.size, f.records);
    if (s.ok()) s = CompareCrcs(f.records, crcs.crcs());
    if (!s.ok()) s = Status::DataLoss("the copy from " + peer + " is corrupt: " + s.message());
  }
  if (header.check_ranges()) f.records.clear();  // the transfer's, not the file's
  munmap(map, mem->capacity());
  if (!s.ok()) {
    recovery_->AbandonRecovery(std::move(mem));
    return s;
  }
  const uint64_t size = f.size;
  s = recovery_->AdoptRecovered(std::move(f), std::move(mem));
  if (s.ok()) recovery_->NoteLoad(job, LoadFrom::kPeer, size);
  return s;
}

Status Replicator::PullHeld(const std::string& job, const std::string& path) {
  if (!options_.held) return Status::NotFound("no copies are held here");
  HeldBackup held;
  int fd = -1;
  Status s = options_.held->OpenForRing(job, path, cache_->RingPeers(job), &held, &fd);
  if (!s.ok()) return s;
  const uint64_t size = held.file.size;
  std::unique_ptr<Buffer> mem;
  s = recovery_->ReserveRecovery(size, &mem);
  void* src = MAP_FAILED;
  if (s.ok() && size > 0) {
    src = mmap(nullptr, size, PROT_READ, MAP_SHARED, fd, 0);
    if (src == MAP_FAILED) s = Status::FromErrno(errno, "mmap a held copy");
  }
  if (s.ok() && size > 0) {
    RecordCrcs crcs(held.file.records);
    Status intact = CheckRecordBounds(size, held.file.records);
    if (intact.ok()) s = CopyInto(*mem, static_cast<const unsigned char*>(src), size, &crcs);
    if (intact.ok() && s.ok()) intact = CompareCrcs(held.file.records, crcs.crcs());
    if (!intact.ok()) s = Status::DataLoss("the copy of " + path + " held here is corrupt: " + intact.message());
  }
  if (src != MAP_FAILED) munmap(src, size);
  ::close(fd);
  if (!s.ok()) {
    recovery_->AbandonRecovery(std::move(mem));
    return s;
  }
  FileInfo f = held.file;
  if (held.check_ranges) f.records.clear();  // the transfer's, not the file's
  f.backup_holder = options_.self;  // the copy stays held here too
  return recovery_->AdoptRecovered(std::move(f), std::move(mem));
}

Status Replicator::CopyInto(const Buffer& mem, const unsigned char* src, uint64_t size, RecordCrcs* crcs) {
  // Piece by piece, each checksummed while it is in the CPU's cache, and
  // written into the memfd (no page faults of a mapping); hugetlbfs has no
  // write(2): through a mapping there.
  constexpr uint64_t kPiece = 1 << 20;
  void* dst = MAP_FAILED;
  if (mem.backing() == Backing::kHugetlb) {
    dst = mmap(nullptr, mem.capacity(), PROT_READ | PROT_WRITE, MAP_SHARED, mem.fd(), 0);
    if (dst == MAP_FAILED) return Status::FromErrno(errno, "mmap a recovery buffer");
  }
  Status s;
  for (uint64_t off = 0; s.ok() && off < size; off += kPiece) {
    const uint64_t n = std::min(kPiece, size - off);
    crcs->Feed(off, src + off, static_cast<size_t>(n));
    if (dst != MAP_FAILED) {
      std::memcpy(static_cast<unsigned char*>(dst) + off, src + off, n);
      continue;
    }
    s = Buffer::WriteAt(mem.fd(), off, src + off, static_cast<size_t>(n), "a recovery buffer");
  }
  if (dst != MAP_FAILED) munmap(dst, mem.capacity());
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
  if (cache_->JobUid(tag.job, &uid)) req.mutable_tag()->set_job_uid(uid);
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
  if (cache_->JobUid(job.job, &uid)) b->set_job_uid(uid);
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
