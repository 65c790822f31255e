// PeerServer: its connections (accepted, bounded, authenticated, joined as
// lanes) and the requests a link serves. The copies it keeps and sends back:
// peer_server_copies.cc; the reads: peer_server_reads.cc.
#include "ring/peer_server.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <system_error>
#include <thread>

#include "cache/record_proto.h"
#include "cache/tag_proto.h"
#include "cache/tag_registry.h"
#include "common/logging.h"
#include "common/validate.h"
#include "tce/v1/tce.pb.h"

namespace tce {

PeerServer::PeerServer(PeerServerOptions options, Transport* transport, BackupStore* store,
                       RingStores stores)
    : options_(std::move(options)),
      transport_(transport),
      store_(store),
      cache_(stores.ring),
      members_(stores.members),
      backups_(stores.backups),
      recovery_(stores.recovery),
      loads_(stores.loads),
      versions_(stores.versions),
      grants_(stores.grants) {}

PeerServer::~PeerServer() { Stop(); }

Status PeerServer::Start() {
  if (options_.key.token.empty())
    return Status::InvalidArgument("the ring needs a cluster token (peer_token or peer_token_file)");
  std::string bound;
  Status s = ListenTcp(options_.listen, &listen_fd_, &bound);
  if (!s.ok()) return s;
  endpoint_ = options_.advertise.empty() ? bound : options_.advertise;
  TCE_LOG(kInfo, "ring") << "peer server on " << bound << " (advertised as " << endpoint_
                         << ", transport " << transport_->name() << ")";
  acceptor_ = std::thread([this] { AcceptLoop(); });
  return Status::OK();
}

void PeerServer::Stop() {
  if (stop_.exchange(true)) return;
  {
    MutexLock l(&mu_);  // wakes BindLanes
  }
  lanes_cv_.SignalAll();
  if (listen_fd_ >= 0) shutdown(listen_fd_, SHUT_RDWR);
  if (acceptor_.joinable()) acceptor_.join();
  if (listen_fd_ >= 0) ::close(listen_fd_);
  std::map<uint64_t, std::thread> workers;
  {
    MutexLock l(&mu_);
    for (int fd : conns_) shutdown(fd, SHUT_RDWR);  // wakes blocked receives
    for (auto& [fd, h] : handshakes_) shutdown(fd, SHUT_RDWR);
    workers.swap(workers_);
    finished_.clear();
  }
  for (auto& [id, t] : workers) t.join();
}

namespace {
std::string SourceOf(const sockaddr_storage& ss) {
  char host[INET6_ADDRSTRLEN] = "?";
  if (ss.ss_family == AF_INET)
    inet_ntop(AF_INET, &reinterpret_cast<const sockaddr_in*>(&ss)->sin_addr, host, sizeof(host));
  else if (ss.ss_family == AF_INET6)
    inet_ntop(AF_INET6, &reinterpret_cast<const sockaddr_in6*>(&ss)->sin6_addr, host, sizeof(host));
  return host;
}
}  // namespace

void PeerServer::AcceptLoop() {
  while (!stop_) {
    ReapWorkers();
    sockaddr_storage ss{};
    socklen_t len = sizeof(ss);
    int fd = accept4(listen_fd_, reinterpret_cast<sockaddr*>(&ss), &len, SOCK_CLOEXEC);
    if (fd < 0) {
      const int err = errno;
      if (err == EINTR || err == ECONNABORTED) continue;
      if (stop_) return;
      uint64_t held = 0;
      if (accept_errors_.Allow(&held))
        TCE_LOG(kError, "ring") << "accept: " << std::strerror(err) << Suppressed(held);
      if (err == EBADF || err == EINVAL || err == ENOTSOCK || err == EOPNOTSUPP || err == EFAULT) return;
      // Out of descriptors or memory (or a transient refusal): wait for
      // connections to end, never spin.
      const auto deadline = options_.clock->Now() + std::chrono::milliseconds(100);
      MutexLock l(&mu_);
      while (!stop_.load() && options_.clock->WaitUntil(&lanes_cv_, &mu_, deadline)) {
      }
      continue;
    }
    Admit(fd, SourceOf(ss));
  }
}

void PeerServer::Admit(int fd, const std::string& source) {
  MutexLock l(&mu_);
  const size_t max_threads = static_cast<size_t>(options_.max_connections) +
                             2 * static_cast<size_t>(options_.max_handshakes);
  if (static_cast<int>(conns_.size()) >= options_.max_connections || workers_.size() >= max_threads) {
    uint64_t held = 0;
    if (refusals_.Allow(&held))
      TCE_LOG(kWarning, "ring") << "refused a peer connection from " << source << ": " << conns_.size()
                                << " links and " << workers_.size() << " connections open"
                                << Suppressed(held);
    ::close(fd);
    return;
  }
  // Beyond a cap, the oldest handshake (from this source, else from anyone)
  // gives way: its socket is shut down and its thread ends.
  auto push_out_oldest = [&](bool same_source, int cap) REQUIRES(mu_) {
    int count = 0;
    auto oldest = handshakes_.end();
    for (auto it = handshakes_.begin(); it != handshakes_.end(); ++it) {
      if (it->second.evicted || (same_source && it->second.source != source)) continue;
      ++count;
      if (oldest == handshakes_.end() || it->second.seq < oldest->second.seq) oldest = it;
    }
    if (count < cap || oldest == handshakes_.end()) return;
    oldest->second.evicted = true;
    shutdown(oldest->first, SHUT_RDWR);
  };
  push_out_oldest(true, options_.max_handshakes_per_source);
  push_out_oldest(false, options_.max_handshakes);
  handshakes_[fd] = Handshake{source, next_seq_++, false};
  const uint64_t id = next_seq_;
  try {
    workers_.emplace(id, std::thread([this, fd, id] { Serve(fd, id); }));
  } catch (const std::system_error& e) {  // out of threads (a pids limit): refuse this one, go on
    handshakes_.erase(fd);
    uint64_t held = 0;
    if (refusals_.Allow(&held))
      TCE_LOG(kError, "ring") << "refused a peer connection from " << source << ": no thread for it ("
                              << e.what() << ")" << Suppressed(held);
    ::close(fd);
  }
}

void PeerServer::ReapWorkers() {
  std::vector<std::thread> done;
  {
    MutexLock l(&mu_);
    for (uint64_t id : finished_) {
      auto it = workers_.find(id);
      if (it == workers_.end()) continue;
      done.push_back(std::move(it->second));
      workers_.erase(it);
    }
    finished_.clear();
  }
  for (auto& t : done) t.join();
}

void PeerServer::Serve(int fd, uint64_t worker) {
  std::unique_ptr<PeerLink> link = PeerLink::Adopt(fd, options_.io_timeout);
  Status s = link->AcceptHandshake(endpoint_, options_.key, options_.handshake_timeout);
  {
    MutexLock l(&mu_);
    handshakes_.erase(fd);  // before the fd can close: Admit shuts down only registered ones
    if (s.ok() && stop_) s = Status::Unavailable("stopping");
    if (s.ok()) conns_.insert(fd);
  }
  if (!s.ok()) {
    uint64_t held = 0;
    if (failed_handshakes_.Allow(&held))
      TCE_LOG(kWarning, "ring") << "refused peer: " << s.ToString() << Suppressed(held);
    link.reset();
  } else {
    ServeLink(&link);
    MutexLock l(&mu_);
    // `link` may have been handed to another as a lane (then it is null here).
    if (link) {
      conns_.erase(fd);
      for (size_t i = 1; i < link->lanes(); ++i) conns_.erase(link->lane(i)->fd());
    }
  }
  link.reset();  // closes the sockets, now that no map names them
  MutexLock l(&mu_);
  finished_.push_back(worker);
}

void PeerServer::ServeLink(std::unique_ptr<PeerLink>* owned) {
  PeerLink* link = owned->get();
  Status s;
  while (s.ok() && !stop_) {
    v1::PeerRequest req;
    s = link->WaitReadable();  // an idle link stays open; the timeouts apply within a request
    if (s.ok()) s = link->Recv(&req);
    if (!s.ok()) break;  // closed or broken: the peer reconnects
    Status result;
    if (req.has_lane()) {
      s = ParkLane(owned, req.lane());
      if (s.ok()) return;  // the socket now belongs to the link it serves
      TCE_LOG(kWarning, "ring") << "refused a lane from " << link->peer() << ": " << s.ToString();
      break;
    } else if (req.has_lanes()) {
      result = BindLanes(link, req.lanes());
    } else if (req.has_backup()) {
      result = ServeBackup(link, req.backup());
      if (result.code() == Status::Code::kUnavailable) break;  // the stream is broken
    } else if (req.has_drop()) {
      store_->Drop(req.drop().job(), req.drop().path(), req.drop().version(), link->peer());
    } else if (req.has_persisted()) {
      const v1::PeerPersisted& p = req.persisted();
      store_->NotePersisted(p.job(), p.path(), p.version(), link->peer(), DiskFromProto(p.storage()));
    } else if (req.has_list()) {
      v1::PeerListReply list;
      Status refused;
      const v1::PeerList& ask = req.list();
      for (const HeldBackup& h : store_->List(ask.job(), ask.owner_node())) {
        Status may = MayRead(h.file.job, link->peer(), h.owner, ask.has_job_uid(), ask.job_uid(), &h.job_uid);
        if (!may.ok()) {
          refused = may;
          continue;
        }
        v1::PeerBackup* b = list.add_files();
        b->set_job(h.file.job);
        b->set_path(h.file.path);
        b->set_size(h.file.size);
        b->set_version(h.file.version);  // save order: the asker pulls the newest first
      }
      for (const HeldTag& t : store_->Tags(ask.job(), ask.owner_node())) {
        Status may = MayRead(t.tag.job, link->peer(), t.owner, ask.has_job_uid(), ask.job_uid(), &t.job_uid);
        if (!may.ok()) {
          refused = may;
          continue;
        }
        TagToProto(t.tag, list.add_tags());
      }
      if (refused.ok() && cache_ &&
          MayRead(ask.job(), link->peer(), "", ask.has_job_uid(), ask.job_uid(), nullptr).ok())
        list.set_own_files(recovery_->InMemoryCount(req.list().job()));
      if (!refused.ok()) {
        TCE_LOG(kWarning, "ring") << "refused the list of job=" << req.list().job() << " to "
                                  << link->peer() << ": " << refused.message();
        list.Clear();
        list.set_code(static_cast<int>(refused.code()));
        list.set_message(refused.message());
      }
      s = link->Send(list);
      continue;
    } else if (req.has_fetch()) {
      s = ServeFetch(link, req.fetch());
      continue;
    } else if (req.has_tag()) {
      result = HoldTag(link, req.tag());
    } else if (req.has_read_range()) {
      s = ServeReadRange(link, req.read_range());
      continue;
    } else if (req.has_version()) {
      s = ServeVersion(link, req.version());
      continue;
    } else if (req.has_durable()) {
      s = ServeDurable(link, req.durable());
      continue;
    } else if (req.has_resync()) {
      if (backups_) backups_->ResendBackups(req.resync().job(), link->peer());
    } else {
      result = Status::InvalidArgument("unknown peer request");
    }
    v1::PeerReply reply;
    reply.set_code(static_cast<int>(result.code()));
    reply.set_message(result.message());
    s = link->Send(reply);
  }
}

Status PeerServer::HoldTag(PeerLink* link, const v1::PeerTag& req) {
  Status s = CheckTag(req.tag(), "tag");  // a peer's bytes are checked as a client's are
  TagInfo tag = TagFromProto(req.tag());
  if (s.ok()) {
    const std::string why = TagRegistry::Check(&tag);
    if (!why.empty()) s = Status::InvalidArgument(why);
  }
  if (s.ok() && tag.complete_unix_ns <= 0)
    s = Status::InvalidArgument("tag " + tag.tag + " has no completion time");
  if (s.ok() && (req.owner_node() < 0 || static_cast<size_t>(req.owner_node()) >= kMaxRingNodes))
    s = Status::InvalidArgument("owner_node " + std::to_string(req.owner_node()) + " is outside a ring");
  if (s.ok() && members_) s = members_->CheckRingSender(tag.job, req.owner_node(), link->peer());
  if (s.ok() && members_)
    s = members_->CheckPeerUid(tag.job, req.has_job_uid(), req.job_uid(), link->peer(), "hold its tags", /*claim=*/true);
  if (s.ok()) s = store_->HoldTag(HeldTag{tag, link->peer(), req.owner_node(), req.job_uid()});
  if (!s.ok()) {
    TCE_LOG(kWarning, "ring") << "refused a tag from " << link->peer() << ": " << s.ToString();
    return s;
  }
  TCE_LOG(kInfo, "ring") << "holding tag job=" << tag.job << " tag=" << tag.tag << " of node "
                         << req.owner_node() << " (" << link->peer() << ")";
  return s;
}

Status PeerServer::MayRead(const std::string& job, const std::string& peer, const std::string& owner, bool named,
                           uint32_t uid, const uid_t* held_uid) {
  Status member;
  const std::vector<std::string> ring = members_ ? members_->RingPeers(job) : std::vector<std::string>();
  if (!ring.empty()) {
    if (std::find(ring.begin(), ring.end(), peer) == ring.end())
      member = Status::PermissionDenied(peer + " is not a member of job " + job + "'s ring here");
  } else if (peer != owner) {  // a ring we were never told: only the sender reads back
    member = Status::PermissionDenied("this server was not told job " + job + "'s ring, and " + peer +
                                      " did not send the copy");
  }
  if (!member.ok()) return member;
  // The ring's members are nodes; the job is also a uid's on each of them.
  if (!held_uid) return members_->CheckPeerUid(job, named, uid, peer, "read its files", /*claim=*/false);
  if (!named) return Status::PermissionDenied(peer + " names no uid for job " + job + ": it may not read its copies");
  if (*held_uid != uid)
    return Status::PermissionDenied("the copies of job " + job + " held here are uid " + std::to_string(*held_uid) +
                                    "'s, and " + peer + " asks for them as uid " + std::to_string(uid));
  return Status::OK();
}

Status PeerServer::ParkLane(std::unique_ptr<PeerLink>* lane, const v1::PeerLane& req) {
  if (req.key().size() != 16 || req.index() < 1 || req.index() >= kMaxLanes)
    return Status::InvalidArgument("bad lane (key of " + std::to_string(req.key().size()) +
                                   " bytes, index " + std::to_string(req.index()) + ")");
  std::vector<std::unique_ptr<PeerLink>> stale;  // closed outside the lock
  {
    MutexLock l(&mu_);
    const auto now = options_.clock->Now();
    for (auto it = parked_.begin(); it != parked_.end();) {  // never claimed: their link died
      if (now - it->second.since <= 2 * options_.io_timeout) {
        ++it;
        continue;
      }
      for (auto& [index, link] : it->second.lanes) {
        conns_.erase(link->fd());
        stale.push_back(std::move(link));
      }
      it = parked_.erase(it);
    }
    Parked& p = parked_[req.key()];
    if (p.lanes.empty()) p.since = now;
    if (p.lanes.count(req.index())) return Status::InvalidArgument("lane " + std::to_string(req.index()) + " twice");
    p.lanes[req.index()] = std::move(*lane);
  }
  lanes_cv_.SignalAll();
  return Status::OK();
}

Status PeerServer::BindLanes(PeerLink* link, const v1::PeerLanes& req) {
  if (req.count() < 2 || req.count() > kMaxLanes || link->lanes() > 1)
    return Status::InvalidArgument("cannot bind " + std::to_string(req.count()) + " lanes to a link with " +
                                   std::to_string(link->lanes()));
  const size_t want = static_cast<size_t>(req.count() - 1);
  const auto deadline = options_.clock->Now() + options_.io_timeout;
  MutexLock l(&mu_);
  auto arrived = [&]() REQUIRES(mu_) {
    auto it = parked_.find(req.key());
    return it != parked_.end() && it->second.lanes.size() >= want;
  };
  bool all = arrived();
  while (!stop_ && !all) {
    const bool woken = options_.clock->WaitUntil(&lanes_cv_, &mu_, deadline);
    all = arrived();
    if (!woken) break;
  }
  auto it = parked_.find(req.key());
  if (!all || stop_ || it == parked_.end())
    return Status::Unavailable("the lanes did not arrive within " + std::to_string(options_.io_timeout.count()) + " ms");
  Parked p = std::move(it->second);
  parked_.erase(it);
  Status s;
  for (int i = 1; s.ok() && i <= static_cast<int>(want); ++i) {
    auto lane = p.lanes.find(i);
    if (lane == p.lanes.end() || lane->second->peer() != link->peer())
      s = Status::InvalidArgument("lane " + std::to_string(i) + " is missing or from another peer");
    else
      link->AddLane(std::move(lane->second));
  }
  for (auto& [index, other] : p.lanes)  // unbound ones close with `p`
    if (other) conns_.erase(other->fd());
  return s;
}

}  // namespace tce
