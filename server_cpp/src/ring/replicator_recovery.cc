// Replicator: copies pulled back. The restore of this node's files from its
// successor, one file pulled from a peer (a copy, a load or a stage) and a
// copy held here adopted into the cache, each checked record by record.
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <set>

#include "cache/record_proto.h"
#include "cache/tag_proto.h"
#include "cache/tag_registry.h"
#include "common/logging.h"
#include "persist/crc.h"
#include "ring/backup_store.h"
#include "ring/replicator.h"
#include "tce/v1/tce.pb.h"

namespace tce {

Status Replicator::Recover(const RecoverJob& job, std::map<std::string, std::unique_ptr<PeerLink>>* links) {
  PeerLink* link = nullptr;
  Status s = Link(job.peer, links, &link);
  if (!s.ok()) return s;
  v1::PeerRequest req;
  req.mutable_list()->set_job(job.job);
  req.mutable_list()->set_owner_node(job.node);
  uid_t uid = 0;
  if (members_->JobUid(job.job, &uid)) req.mutable_list()->set_job_uid(uid);
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
  ProgressBoard::Entry shown = progress_.Begin(ProgressBoard::kRingRestore, job.job, "", job.peer, uid);
  uint64_t listed_bytes = 0;
  for (const v1::PeerBackup& f : list.files()) listed_bytes += f.size();
  shown.SetTotal(list.files_size(), listed_bytes);
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
      backups_->NoteBackupError("recovery of " + f.path() + ": " + p.ToString());
    }
    shown.AddDone(1, p.ok() ? f.size() : 0, p.ok() ? 0 : 1);
  }
  shown.End();
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
  restores_->End(job.job, job.peer);  // loads waiting for the restore go on
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
  if (members_->JobUid(job, &uid)) req.mutable_fetch()->set_job_uid(uid);
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
    const std::vector<std::string> nodes = members_->RingNodes(job);
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
  if (s.ok()) loads_->NoteLoad(job, LoadFrom::kPeer, size);
  return s;
}

Status Replicator::PullHeld(const std::string& job, const std::string& path) {
  if (!options_.held) return Status::NotFound("no copies are held here");
  HeldBackup held;
  int fd = -1;
  Status s = options_.held->OpenForRing(job, path, members_->RingPeers(job), &held, &fd);
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

}  // namespace tce
