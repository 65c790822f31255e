// PeerServer: the reads it serves: ranges of a held copy or of this node's
// own file (for a ring member; or, for a following node, a published
// version's, served as it lands when this node is bringing it), and the
// published versions a following node asks for. See ring/peer_server.h.
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>

#include "cache/tag_proto.h"
#include "common/logging.h"
#include "common/validate.h"
#include "persist/crc.h"
#include "ring/peer_server.h"
#include "ring/range_read.h"
#include "ring/version_follower.h"

namespace tce {

namespace {

// The CRC-32 of a whole file of `size` bytes in `fd` (a memfd), read
// through a read-only mapping.
Status CrcOfFile(int fd, uint64_t size, uint32_t* crc) {
  *crc = 0;
  if (size == 0) return Status::OK();
  void* map = mmap(nullptr, size, PROT_READ, MAP_SHARED, fd, 0);
  if (map == MAP_FAILED) return Status::FromErrno(errno, "mmap");
  *crc = Crc32(0, static_cast<const unsigned char*>(map), size);
  munmap(map, size);
  return Status::OK();
}

}  // namespace

void PeerServer::DigestVersion(TagInfo* tag) {
  auto work = [&] {
    std::vector<PeerVersions::DigestPin> pins;
    versions_->VersionDigests(tag, &pins);
    for (const PeerVersions::DigestPin& p : pins) {
      TagFile& f = tag->files[p.file];
      uint32_t crc = 0;
      if (CrcOfFile(p.fd, f.size, &crc).ok()) {
        f.crc32 = crc;
        f.has_crc32 = true;
      }
      ::close(p.fd);
      recovery_->EndPeerRead(p.buffer_id);
    }
    if (!pins.empty()) versions_->RecordDigests(*tag);
    return Status::OK();
  };
  bool shared = false;
  (void)digests_.Do({tag->job, tag->tag}, work, &shared);
  if (shared) (void)work();  // the digests the other computed, recorded now
}

Status PeerServer::ServeReadRange(PeerLink* link, const v1::PeerReadRange& req) {
  const std::string& peer = link->peer();
  v1::PeerRangeReply reply;
  HeldBackup held;
  int fd = -1;
  uint64_t pinned = 0;  // a buffer of the cache, when the file is this server's own
  VersionFollower* transfer = nullptr;  // a transfer in flight here, when the bytes are its
  const bool following = !req.version_tag().empty();  // a following node's read of a version's file
  Status s = following ? Status::NotFound("") : store_->Open(req.job(), req.path(), &held, &fd);
  if (s.ok()) {
    s = MayRead(held.file.job, peer, held.owner, req.has_job_uid(), req.job_uid(), &held.job_uid);
    reply.set_held(true);
  } else if (cache_ && following) {  // granted to the node its link authenticated
    s = grants_->CheckPeerVersionRead(req.job(), req.version_tag(), req.path(), peer);
    VersionFollower* follower = follower_.load();
    if (s.ok()) {
      s = versions_->StartVersionRead(req.job(), req.path(), req.version_tag(), &held.file, &fd);
      if (s.ok()) pinned = held.file.buffer_id;
    }
    if (s.code() == Status::Code::kNotFound && follower) {  // on its way here: served as it lands
      uint64_t size = 0;
      s = follower->OpenRange(req.job(), req.version_tag(), req.path(), req.offset(), req.length(), &fd, &size);
      if (s.ok()) {
        transfer = follower;
        held.file.size = size;
      } else if (s.code() == Status::Code::kNotFound) {  // it just landed whole
        s = versions_->StartVersionRead(req.job(), req.path(), req.version_tag(), &held.file, &fd);
        if (s.ok()) pinned = held.file.buffer_id;
      }
    }
  } else if (cache_) {  // this server's own file, for a member of the job's ring only
    s = MayRead(req.job(), peer, "", req.has_job_uid(), req.job_uid(), nullptr);
    if (s.ok()) s = recovery_->StartPeerRead(req.job(), req.path(), &held.file, &fd);
    if (s.ok()) pinned = held.file.buffer_id;
  } else {
    s = Status::NotFound(req.path() + " is not held here");
  }
  if (s.ok()) s = CheckRange(req.offset(), req.length(), held.file.size);
  uint32_t crc = 0;
  if (s.ok() && req.raw()) {
    s = CrcOfRange(fd, req.offset(), req.length(), &crc);
  } else if (s.ok()) {
    s = ReadRangeOf(fd, req.offset(), req.length(), reply.mutable_data());
    if (s.ok())
      crc = Crc32(0, reinterpret_cast<const unsigned char*>(reply.data().data()), reply.data().size());
  }
  if (s.code() == Status::Code::kPermissionDenied)
    TCE_LOG(kWarning, "ring") << "refused a ranged read of job=" << req.job() << " path=" << req.path()
                              << " to " << peer << ": " << s.message();
  Status sent;
  if (!s.ok()) {
    reply.Clear();
    reply.set_code(static_cast<int>(s.code()));
    reply.set_message(s.message());
    sent = link->Send(reply);
  } else {
    reply.set_file_size(held.file.size);
    reply.set_version(held.file.version);
    reply.set_crc32(crc);
    if (req.raw()) reply.set_raw_length(req.length());
    sent = link->Send(reply);
    // The bytes go from the buffer the CRC was computed on (a held copy
    // replaced meanwhile fails the asker's check of that CRC).
    if (sent.ok() && req.raw()) sent = link->SendFile(fd, req.offset(), req.length());
    if (sent.ok() && following) versions_->NoteVersionRangeServed();
  }
  if (fd >= 0) ::close(fd);
  if (pinned) recovery_->EndPeerRead(pinned);
  if (transfer) transfer->CloseRange(req.job(), req.path());
  return sent;
}

Status PeerServer::ServeVersion(PeerLink* link, const v1::PeerVersion& req) {
  v1::PeerVersionReply reply;
  TagInfo tag;
  std::vector<std::string> nodes;
  Status s = cache_ ? ValidateName("job", req.job(), /*allow_empty=*/false, /*allow_slash=*/true)
                    : Status::NotFound("this server holds no published versions");
  if (s.ok()) {  // asked as the node the link authenticated, whatever uid asked there
    const auto wait = std::chrono::milliseconds(std::min<uint32_t>(req.wait_ms(), kMaxVersionWaitMs));
    s = grants_->PeerGetVersion(req.job(), req.after(), req.epoch(), wait, link->peer(), &tag, &nodes);
  }
  if (s.code() == Status::Code::kPermissionDenied)
    TCE_LOG(kWarning, "ring") << "refused the versions of job=" << req.job() << " to " << link->peer() << ": "
                              << s.message();
  reply.set_code(static_cast<int>(s.code()));
  reply.set_message(s.message());
  if (s.ok()) {
    DigestVersion(&tag);  // the publisher's digests, for the following node to check the bytes against
    TagToProto(tag, reply.mutable_tag());
  }
  if (s.ok() || s.code() == Status::Code::kDeadlineExceeded)  // a granted node: nothing newer yet
    for (std::string& n : nodes) reply.add_nodes(std::move(n));
  return link->Send(reply);
}

Status PeerServer::ServeDurable(PeerLink* link, const v1::PeerDurable& req) {
  v1::PeerDurableReply reply;
  Status s = cache_ ? MayRead(req.job(), link->peer(), "", req.has_job_uid(), req.job_uid(), nullptr)
                    : Status::NotFound("this server keeps no files of its own");
  if (s.ok() && req.paths_size() > kMaxDurablePaths)
    s = Status::InvalidArgument("asked about " + std::to_string(req.paths_size()) + " files (at most " +
                                std::to_string(kMaxDurablePaths) + ")");
  if (s.ok()) {
    for (std::string& p : cache_->DurableOf(req.job(), {req.paths().begin(), req.paths().end()}))
      reply.add_durable(std::move(p));
  } else {
    reply.set_code(static_cast<int>(s.code()));
    reply.set_message(s.message());
  }
  return link->Send(reply);
}

}  // namespace tce
