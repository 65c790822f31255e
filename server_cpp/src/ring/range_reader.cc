#include "ring/range_reader.h"

#include <unistd.h>

#include <algorithm>
#include <cstring>

#include "common/logging.h"
#include "persist/crc.h"
#include "ring/range_read.h"

namespace tce {
namespace {
constexpr size_t kMaxHolders = 4096;
}  // namespace

std::chrono::milliseconds RangeReader::ConnectTimeout(Clock::TimePoint deadline) const {
  return std::max(std::chrono::milliseconds(1), std::min(options_.clock->Left(deadline), options_.io_timeout));
}

RangeReader::RangeReader(RingStores stores, RangeReaderOptions options)
    : members_(stores.members), recovery_(stores.recovery), options_(std::move(options)) {}

Status RangeReader::Read(const std::string& job, const std::string& path, uint64_t offset,
                         uint64_t length, RangeRead* out, unsigned char* into, const PeerWait& wait) {
  // Where the bytes go: `into`, else out->data (once the length is known good).
  unsigned char* to = into;
  out->data.clear();
  if (!to) {
    if (length == 0 || length > kMaxRangeLength) return CheckRange(0, length, length);
    out->data.resize(length);
    to = reinterpret_cast<unsigned char*>(&out->data[0]);
  }
  Status s = ReadInto(job, path, offset, length, out, to, wait);
  if (!s.ok() && !into) out->data.clear();
  return s;
}

Status RangeReader::ReadInto(const std::string& job, const std::string& path, uint64_t offset,
                             uint64_t length, RangeRead* out, unsigned char* to, const PeerWait& wait) {
  Status s = ReadOwn(job, path, offset, length, out, to);
  if (s.code() != Status::Code::kNotFound) return s;
  s = ReadHeld(job, path, offset, length, out, to);
  if (s.code() != Status::Code::kNotFound) return s;
  if (options_.self.empty()) return s;
  std::vector<std::string> peers = members_->RingPeers(job);
  {
    MutexLock l(&mu_);
    auto it = holder_.find({job, path});
    if (it != holder_.end()) {
      auto p = std::find(peers.begin(), peers.end(), it->second);
      if (p != peers.end()) std::rotate(peers.begin(), p, p + 1);
    }
  }
  Status last = Status::NotFound(path + " is in no ring member's memory for job " + job);
  if (peers.empty()) return last;
  // A peer that never answers holds this thread until its timeout: the
  // caller decides whether it may wait on peers now.
  if (wait.admit && !(s = wait.admit()).ok()) return s;
  size_t asked = 0;
  for (const std::string& peer : peers) {
    if (options_.is_down && options_.is_down(job, peer)) continue;  // it did not answer a moment ago
    if (asked > 0 && options_.clock->Now() >= wait.deadline)
      return Status::DeadlineExceeded("the call's deadline passed after asking " + std::to_string(asked) +
                                      " of " + std::to_string(peers.size()) + " ring members for " + path +
                                      " (last: " + last.message() + ")");
    ++asked;
    bool silent = false;
    s = ReadPeer(peer, job, path, offset, length, out, to, wait.deadline, "", &silent);
    if (silent && options_.mark_down && options_.clock->Now() < wait.deadline) options_.mark_down(job, peer);
    if (s.ok()) {
      ++peer_reads_;
      peer_bytes_ += length;
      MutexLock l(&mu_);
      if (holder_.size() >= kMaxHolders) holder_.clear();
      holder_[{job, path}] = peer;
      return s;
    }
    // The range does not fit the file a member has: the file is there, the request is bad.
    if (s.code() == Status::Code::kOutOfRange || s.code() == Status::Code::kInvalidArgument) return s;
    if (s.code() != Status::Code::kNotFound) {  // unreachable, refused or corrupt: the next one
      TCE_LOG(kWarning, "ring") << "ranged read of job=" << job << " path=" << path << " from "
                                << peer << ": " << s.ToString();
      if (last.code() != Status::Code::kDataLoss)
        last = s.code() == Status::Code::kDataLoss
                   ? s
                   : Status::NotFound(path + " could not be read from the ring: " + s.message());
    }
  }
  return last;
}

Status RangeReader::ReadOwn(const std::string& job, const std::string& path, uint64_t offset,
                            uint64_t length, RangeRead* out, unsigned char* to) {
  FileInfo f;
  int fd = -1;
  Status s = recovery_->StartPeerRead(job, path, &f, &fd);
  if (!s.ok()) return s;
  s = CheckRange(offset, length, f.size);
  if (s.ok()) s = ReadRangeOf(fd, offset, length, to);
  ::close(fd);
  recovery_->EndPeerRead(f.buffer_id);
  if (!s.ok()) return s;
  out->source = v1::RANGE_SOURCE_LOCAL;
  out->file_size = f.size;
  ++local_reads_;
  return s;
}

Status RangeReader::ReadHeld(const std::string& job, const std::string& path, uint64_t offset,
                             uint64_t length, RangeRead* out, unsigned char* to) {
  if (!options_.held) return Status::NotFound("no copies are held here");
  HeldBackup held;
  int fd = -1;
  Status s = options_.held->OpenForRing(job, path, members_->RingPeers(job), &held, &fd);
  if (!s.ok()) return Status::NotFound(s.message());  // then the ring's peers, or storage
  uid_t uid = 0;
  if (!members_->JobUid(job, &uid) || uid != held.job_uid) {  // another uid's job of the same name
    ::close(fd);
    return Status::NotFound("the copy of " + path + " held here is of uid " + std::to_string(held.job_uid) +
                            "'s job " + job);
  }
  s = CheckRange(offset, length, held.file.size);
  if (s.ok()) s = ReadRangeOf(fd, offset, length, to);
  ::close(fd);
  if (!s.ok()) return s;
  out->source = v1::RANGE_SOURCE_HELD;
  out->file_size = held.file.size;
  ++held_reads_;
  return s;
}

Status RangeReader::ReadVersionFile(const std::string& peer, const std::string& job, const std::string& tag,
                                    const std::string& path, uint64_t offset, uint64_t length, unsigned char* to,
                                    uint64_t* file_size, Clock::TimePoint deadline) {
  RangeRead out;
  Status s = ReadPeer(peer, job, path, offset, length, &out, to, deadline, tag);
  if (s.ok()) {
    ++peer_reads_;
    peer_bytes_ += length;
    *file_size = out.file_size;
  }
  return s;
}

Status RangeReader::ReadPeer(const std::string& peer, const std::string& job, const std::string& path,
                             uint64_t offset, uint64_t length, RangeRead* out, unsigned char* to,
                             Clock::TimePoint deadline, const std::string& tag, bool* silent) {
  v1::PeerRequest req;
  v1::PeerReadRange* r = req.mutable_read_range();
  r->set_job(job);
  r->set_path(path);
  r->set_offset(offset);
  r->set_length(length);
  r->set_raw(true);  // the bytes after the reply, on the data path
  uid_t uid = 0;
  if (!tag.empty()) {
    r->set_version_tag(tag);
  } else if (members_->JobUid(job, &uid)) {
    r->set_job_uid(uid);
  }
  v1::PeerRangeReply reply;
  std::unique_ptr<PeerLink> link;
  Status s;
  // A kept link may have died while idle (the peer restarted): one more try on a new one.
  for (int attempt = 0; attempt < 2; ++attempt) {
    link = attempt == 0 ? TakeLink(peer) : nullptr;
    const bool kept = link != nullptr;
    s = Status::OK();
    if (!link) s = PeerLink::Connect(peer, options_.self, options_.key, ConnectTimeout(deadline), &link,
                                     options_.breaker);
    if (!s.ok()) {
      if (silent) *silent = s.code() == Status::Code::kDeadlineExceeded;  // it accepted, and said nothing
      return Status::Unavailable(s.message());
    }
    if (deadline != Clock::TimePoint::max())  // the link's clock is the real one
      link->SetDeadline(Clock::Real()->Now() + (deadline - options_.clock->Now()));
    reply.Clear();
    s = link->Send(req);
    if (s.ok()) s = link->Recv(&reply);
    if (s.ok()) break;
    if (silent) *silent = link->timed_out();
    // A kept link that failed at once: the peer may have restarted. One that
    // waited out the timeout: the peer stopped answering.
    if (!kept || link->timed_out()) return Status::Unavailable(s.message());  // the link is dropped
  }
  if (!s.ok()) return Status::Unavailable(s.message());
  if (reply.code() != 0) {
    ReturnLink(peer, std::move(link));  // in step: one reply per request
    const auto code = static_cast<Status::Code>(reply.code());
    const bool known = code == Status::Code::kNotFound || code == Status::Code::kOutOfRange ||
                       code == Status::Code::kInvalidArgument || code == Status::Code::kPermissionDenied;
    return Status::FromCode(known ? code : Status::Code::kUnavailable,
                            peer + ": " + reply.message().substr(0, 1024));
  }
  if (reply.raw_length() != 0) {  // the bytes follow the reply
    if (reply.raw_length() != length || !reply.data().empty())  // out of step: the link goes
      return Status::DataLoss(peer + " announced " + std::to_string(reply.raw_length()) +
                              " raw bytes (and " + std::to_string(reply.data().size()) +
                              " in the reply) for a range of " + std::to_string(length));
    s = link->RecvAll(to, length);  // straight where they go, checked below before use
    if (!s.ok())  // the link goes
      return Status::DataLoss(peer + " sent less than the " + std::to_string(length) +
                              " bytes it announced: " + s.message());
  } else if (reply.data().size() != length) {  // a holder that sends the bytes inside the reply
    ReturnLink(peer, std::move(link));
    return Status::DataLoss(peer + " sent " + std::to_string(reply.data().size()) + " bytes for a range of " +
                            std::to_string(length));
  } else {
    memcpy(to, reply.data().data(), length);
  }
  ReturnLink(peer, std::move(link));  // in step: every byte of the reply was read
  if (Status fits = CheckRange(offset, length, reply.file_size()); !fits.ok())
    return Status::DataLoss(peer + " says the file has " + std::to_string(reply.file_size()) +
                            " bytes, too few for the range it sent");
  if (Crc32(0, to, length) != reply.crc32())
    return Status::DataLoss("the bytes from " + peer + " do not match their CRC-32");
  out->source = v1::RANGE_SOURCE_PEER;
  out->file_size = reply.file_size();
  return Status::OK();
}

std::unique_ptr<PeerLink> RangeReader::TakeLink(const std::string& peer) {
  MutexLock l(&mu_);
  auto it = idle_.find(peer);
  if (it == idle_.end() || it->second.empty()) return nullptr;
  std::unique_ptr<PeerLink> link = std::move(it->second.back());
  it->second.pop_back();
  return link;
}

void RangeReader::ReturnLink(const std::string& peer, std::unique_ptr<PeerLink> link) {
  link->ClearDeadline();
  MutexLock l(&mu_);
  std::vector<std::unique_ptr<PeerLink>>& idle = idle_[peer];
  if (idle.size() < kIdleLinks) idle.push_back(std::move(link));
}

}  // namespace tce
