// PeerServer: the copies it keeps and sends back: a backup received and
// checked before it is kept, and a held copy or this node's own file sent
// back (read from storage first where the restore plan names this node).
// See ring/peer_server.h.
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <memory>
#include <thread>

#include "cache/record_proto.h"
#include "common/logging.h"
#include "common/validate.h"
#include "persist/crc.h"
#include "ring/peer_server.h"

namespace tce {

namespace {

// The record CRCs of a file in memory (persistence may not have computed
// them), from a read-only mapping of `fd`.
Status FillCrcs(int fd, FileInfo* f) {
  if (f->size == 0) return Status::OK();
  void* map = mmap(nullptr, f->size, PROT_READ, MAP_SHARED, fd, 0);
  if (map == MAP_FAILED) return Status::FromErrno(errno, "mmap " + f->path);
  RecordCrcs crcs(f->records);
  crcs.Feed(0, static_cast<const unsigned char*>(map), static_cast<size_t>(f->size));
  munmap(map, f->size);
  for (size_t i = 0; i < f->records.size(); ++i) f->records[i].crc32 = crcs.crcs()[i];
  return Status::OK();
}

}  // namespace

Status PeerServer::ServeBackup(PeerLink* link, const v1::PeerBackup& req) {
  std::unique_ptr<MappedBuffer> buffer;
  // Only the node the job's ring names sends copies as that node.
  Status reserved = members_ ? members_->CheckRingSender(req.job(), req.owner_node(), link->peer()) : Status::OK();
  if (reserved.ok() && members_)  // and only as the uid the job belongs to here
    reserved = members_->CheckPeerUid(req.job(), req.has_job_uid(), req.job_uid(), link->peer(), "hold its copies",
                                      /*claim=*/true);
  if (!reserved.ok())
    TCE_LOG(kWarning, "ring") << "refused a backup of job=" << req.job().substr(0, 256) << " from "
                              << link->peer() << ": " << reserved.message();
  if (reserved.ok()) reserved = store_->Reserve(req.job(), req.path(), req.size(), &buffer);
  std::vector<Record> records = RecordsFromProto(req.records());
  // The bytes (and the CRC trailer) follow the header whatever we answer:
  // take them, into the buffer or away, so the stream stays in step.
  Status s;
  RecordCrcs crcs(records);
  if (reserved.ok()) {  // checksummed chunk by chunk as they land (the next is on its way)
    s = transport_->Recv(link, RecvDest{buffer->data(), buffer->buffer().fd()}, req.size(),
                         [&](uint64_t off, uint64_t n, const unsigned char* data) {
                           crcs.Feed(off, data, static_cast<size_t>(n));
                         });
  } else {
    s = transport_->Refuse(link, req.size(), reserved);
    if (!s.ok() && s.code() != Status::Code::kUnavailable) return reserved;  // refused, link in step
  }
  if (s.ok() && req.crc_trailer()) {  // the sender's CRCs, computed while sending
    v1::PeerChecksums theirs;
    s = link->Recv(&theirs);
    if (s.ok() && static_cast<size_t>(theirs.crc32_size()) != records.size())
      s = Status::InvalidArgument("the checksum trailer has " + std::to_string(theirs.crc32_size()) +
                                  " CRCs for " + std::to_string(records.size()) + " records");
    for (size_t i = 0; s.ok() && i < records.size(); ++i)
      records[i].crc32 = theirs.crc32(static_cast<int>(i));
  }
  if (s.ok() && reserved.ok()) {
    s = CompareCrcs(records, crcs.crcs());
    if (!s.ok()) {
      store_->CountCorrupt();
      TCE_LOG(kError, "ring") << "rejected backup from " << link->peer() << " job=" << req.job()
                              << " path=" << req.path() << ": " << s.message();
      s = Status::DataLoss(s.message());
    } else {
      HeldBackup held;
      held.file.job = req.job();
      held.file.tag = req.tag();
      held.file.rank = req.rank();
      held.file.path = req.path();
      held.file.size = req.size();
      held.file.version = req.version();
      held.file.records = std::move(records);
      if (req.has_storage()) held.file.disk = DiskFromProto(req.storage());
      held.check_ranges = req.check_ranges();
      held.owner = link->peer();
      held.owner_node = req.owner_node();
      held.job_uid = req.job_uid();
      held.buffer = std::move(buffer);
      store_->Commit(std::move(held));
    }
  }
  if (buffer) store_->Abandon(std::move(buffer));
  return reserved.ok() ? s : reserved;
}

Status PeerServer::LoadForPeer(PeerLink* link, const std::string& job, const std::string& path) {
  // Read on a thread of its own, so this one can tell the asker, within
  // each of its timeouts, that the answer is coming. An asker that hangs up
  // does not end the read: the file lands in the cache all the same.
  struct Read {
    Mutex mu;
    CondVar cv;
    bool done GUARDED_BY(mu) = false;
    Status result GUARDED_BY(mu);
  };
  auto read = std::make_shared<Read>();
  StorageLoads* loads = loads_;
  std::thread reader([loads, read, job, path] {
    Status s = loads->LoadFromStorage(job, path, /*for_peer=*/true);
    MutexLock l(&read->mu);
    read->done = true;
    read->result = s;
    read->cv.SignalAll();
  });
  const auto beat = std::max<Clock::Duration>(std::chrono::milliseconds(50), options_.io_timeout / 3);
  bool asker_there = true;
  Status s;
  {
    MutexLock l(&read->mu);
    while (!read->done) {
      const Clock::TimePoint until = options_.clock->Now() + beat;
      while (!read->done && options_.clock->WaitUntil(&read->cv, &read->mu, until)) {
      }
      if (read->done || !asker_there) continue;
      l.Unlock();
      v1::PeerReply loading;
      loading.set_loading(true);
      asker_there = link->Send(loading).ok();
      l.Lock();
    }
    s = read->result;
  }
  reader.join();
  if (!s.ok())
    TCE_LOG(kWarning, "ring") << "could not read job=" << job << " path=" << path << " from storage for "
                              << link->peer() << ": " << s.ToString();
  return s;
}

void PeerServer::DropClaimsOfDown(const v1::PeerFetch& req, const std::string& asker) {
  if (req.down().empty()) return;
  const std::vector<std::string> nodes = members_->RingNodes(req.job());
  int seen = 0;
  for (const std::string& node : req.down()) {
    if (++seen > 16) break;  // a ring member reports the reader it found down: one
    if (node == endpoint() || std::find(nodes.begin(), nodes.end(), node) == nodes.end()) continue;
    const size_t n = loads_->DropClaims(req.job(), node);
    if (n > 0)
      TCE_LOG(kWarning, "ring") << "dropped " << n << " claim(s) of " << node << " on files of job=" << req.job()
                                << ": " << asker << " found it not answering; the next node that asks reads them";
  }
}

Status PeerServer::ServeFetch(PeerLink* link, const v1::PeerFetch& req) {
  HeldBackup held;
  int fd = -1;
  uint64_t pinned = 0;  // a buffer of the cache, when the file is this server's own
  Status found = store_->Open(req.job(), req.path(), &held, &fd);
  if (found.ok()) {
    found = MayRead(held.file.job, link->peer(), held.owner, req.has_job_uid(), req.job_uid(), &held.job_uid);
  } else if (cache_) {  // this server's own file, for a member of the job's ring only
    Status member = MayRead(req.job(), link->peer(), "", req.has_job_uid(), req.job_uid(), nullptr);
    found = member.ok() ? recovery_->StartPeerRead(req.job(), req.path(), &held.file, &fd) : member;
    if (found.code() == Status::Code::kNotFound && req.load()) {  // the restore plan names this node
      found = ValidateName("job", req.job(), /*allow_empty=*/false, /*allow_slash=*/true);
      if (found.ok()) found = ValidatePath(req.path());  // a name storage is read at: checked as a client's
      if (found.ok() && req.claim()) DropClaimsOfDown(req, link->peer());
      // Not begun here: the first node that asks reads it (it needs it).
      const std::string reader = found.ok() && req.claim() ? loads_->ClaimRead(req.job(), req.path(), link->peer())
                                                           : endpoint();
      if (found.ok() && reader != endpoint()) {
        v1::PeerReply redirect;
        redirect.set_reader(reader);
        return link->Send(redirect);
      }
      if (found.ok()) found = LoadForPeer(link, req.job(), req.path());
      if (found.ok()) found = recovery_->StartPeerRead(req.job(), req.path(), &held.file, &fd);
    }
    if (found.ok()) {
      pinned = held.file.buffer_id;
      if (held.file.records.empty()) {  // not a torch zip: ranges, so every byte is checked
        held.file.records = CheckRanges(held.file.size);
        held.check_ranges = true;
      }
      found = FillCrcs(fd, &held.file);  // the puller checks every record
    }
  }
  if (!found.ok() && fd >= 0) {
    ::close(fd);
    fd = -1;
  }
  if (found.code() == Status::Code::kPermissionDenied)
    TCE_LOG(kWarning, "ring") << "refused to send job=" << req.job() << " path=" << req.path()
                              << " to " << link->peer() << ": " << found.message();
  struct Unpin {
    RecoveryStore* reads;
    uint64_t id;
    ~Unpin() {
      if (id) reads->EndPeerRead(id);
    }
  } unpin{recovery_, pinned};
  v1::PeerReply reply;
  reply.set_code(static_cast<int>(found.code()));
  reply.set_message(found.message());
  Status s = link->Send(reply);
  if (found.ok() && req.stage()) {  // in memory here for the asker's ranged reads
    ::close(fd);
    return s;
  }
  if (found.ok()) {
    v1::PeerBackup header;
    header.set_job(held.file.job);
    header.set_tag(held.file.tag);
    header.set_rank(held.file.rank);
    header.set_path(held.file.path);
    header.set_size(held.file.size);
    header.set_version(held.file.version);
    header.set_owner_node(held.owner_node);
    RecordsToProto(held.file.records, header.mutable_records());
    if (held.file.disk.known) DiskToProto(held.file.disk, header.mutable_storage());
    header.set_check_ranges(held.check_ranges);
    if (s.ok()) s = link->Send(header);
    if (s.ok()) s = transport_->Send(link, SendSource{fd, held.file.size}, nullptr);
    ::close(fd);
    if (!s.ok() && s.code() != Status::Code::kUnavailable) {  // refused by the puller: link in step
      TCE_LOG(kWarning, "ring") << "not sent back job=" << req.job() << " path=" << req.path() << ": " << s.ToString();
      return Status::OK();
    }
    TCE_LOG(kInfo, "ring") << "sent back job=" << req.job() << " path=" << req.path() << " to "
                           << link->peer() << ": " << (s.ok() ? "ok" : s.ToString());
  }
  return s;
}

}  // namespace tce
