// Cache: sessions (one per client connection), who may act on which job,
// leases on loaded files, and the fds a session gets for its buffers.
#include "cache/cache.h"

#include <sys/random.h>

#include <cstdio>

#include "common/logging.h"

namespace tce {
namespace {

std::string RandomSessionId() {
  unsigned char bytes[16];
  size_t got = 0;
  while (got < sizeof(bytes)) {
    ssize_t n = getrandom(bytes + got, sizeof(bytes) - got, 0);
    if (n > 0) got += static_cast<size_t>(n);
  }
  char hex[33];
  for (int i = 0; i < 16; ++i) snprintf(hex + 2 * i, 3, "%02x", bytes[i]);
  return std::string(hex, 32);
}

}  // namespace

std::string Cache::OpenSession(uid_t uid, pid_t pid, gid_t gid) {
  std::string id = RandomSessionId();
  MutexLock lock(&mu_);
  Session& session = sessions_[id];
  session.uid = uid;
  session.gid = gid;
  session.pid = pid;
  session.last_used = std::chrono::steady_clock::now();
  TCE_LOG(kInfo, "session") << "opened session=" << id.substr(0, 8) << " uid=" << uid
                            << " pid=" << pid;
  return id;
}

void Cache::CloseSession(const std::string& session) {
  MutexLock lock(&mu_);
  auto sit = sessions_.find(session);
  if (sit == sessions_.end()) return;
  size_t aborted = 0, dropped = 0;
  for (auto it = pending_.begin(); it != pending_.end();) {
    if (it->second.session == session) {
      uint64_t buffer_id = it->second.buffer_id;
      RecordFate(it->first, Fate::kAborted);
      it = pending_.erase(it);
      ReleaseBuffer(buffer_id);
      ++aborted;
    } else {
      ++it;
    }
  }
  for (auto it = leases_.begin(); it != leases_.end();) {
    if (it->second.session == session) {
      DropLease(it++);
      ++dropped;
    } else {
      ++it;
    }
  }
  std::vector<uint64_t> ids;
  for (auto& [id, buf] : buffers_) ids.push_back(id);
  for (uint64_t id : ids) {
    auto b = buffers_.find(id);
    if (b != buffers_.end()) DropMapper(b->second, session);
  }
  if (pending_.empty()) quiet_cv_.SignalAll();
  TCE_LOG(kInfo, "session") << "closed session=" << session.substr(0, 8)
                            << " pid=" << sit->second.pid << " aborted=" << aborted
                            << " leases_dropped=" << dropped;
  sessions_.erase(sit);
}

Status Cache::CheckSession(const std::string& session) {
  auto it = sessions_.find(session);
  if (it != sessions_.end()) {
    it->second.last_used = std::chrono::steady_clock::now();
    return Status::OK();
  }
  return Status::Unauthenticated(
      "unknown session '" + session.substr(0, 32) +
      "': open a session on the server's fd socket (<socket>.fd) first");
}

Status Cache::CheckAccess(const std::string& session, const std::string& job,
                          const std::string& what, bool claim) {
  Status s = CheckSession(session);
  if (!s.ok()) return s;
  const uid_t uid = sessions_[session].uid;
  s = claim ? owners_.Claim(uid, job, what) : owners_.Check(uid, job, what);
  uint64_t dropped = 0;
  if (!s.ok() && refused_log_.Allow(&dropped))
    TCE_LOG(kWarning, "access") << "refused: " << s.message() << Suppressed(dropped);
  return s;
}

Status Cache::CheckCaller(const std::string& session, bool* admin) {
  MutexLock lock(&mu_);
  Status s = CheckSession(session);
  if (s.ok()) *admin = owners_.IsAdmin(sessions_[session].uid);
  return s;
}

void Cache::SetSessionLimits(const SessionLimits& limits) {
  MutexLock lock(&mu_);
  owners_.set_root_is_admin(limits.root_is_admin);
  max_leases_per_session_ = limits.max_leases_per_session;
}

std::vector<std::string> Cache::IdleSessions(std::chrono::milliseconds idle) {
  MutexLock lock(&mu_);
  std::set<std::string> busy;
  for (const auto& [id, a] : pending_) busy.insert(a.session);
  const auto now = std::chrono::steady_clock::now();
  std::vector<std::string> out;
  for (const auto& [id, sess] : sessions_) {
    if (sess.leases == 0 && !busy.count(id) && now - sess.last_used >= idle) out.push_back(id);
  }
  return out;
}

void Cache::DropLease(std::map<uint64_t, Lease>::iterator it) {
  auto sess = sessions_.find(it->second.session);
  if (sess != sessions_.end() && sess->second.leases > 0) --sess->second.leases;
  auto b = buffers_.find(it->second.buffer_id);
  leases_.erase(it);
  if (b != buffers_.end()) {
    --b->second.leases;
    MaybeFree(b->second);
  }
}

void Cache::DropMapper(Buf& buf, const std::string& session) {
  if (!buf.mappers.erase(session)) return;
  if (buf.state == BufState::kRetiring && buf.mappers.empty()) {
    used_ -= buf.capacity;
    TCE_LOG(kDebug, "cache") << "retired buffer=" << buf.id << " released by its last mapper";
    buffers_.erase(buf.id);
  }
}

void Cache::TakeUnmaps(const std::string& session, std::vector<uint64_t>* out) {
  auto it = sessions_.find(session);
  if (it == sessions_.end()) return;
  out->insert(out->end(), it->second.pending_unmap.begin(), it->second.pending_unmap.end());
  it->second.pending_unmap.clear();
}

Status Cache::Release(const std::string& session, const std::vector<uint64_t>& lease_ids,
                      const std::vector<uint64_t>& unmapped_buffer_ids) {
  MutexLock lock(&mu_);
  Status s = CheckSession(session);
  if (!s.ok()) return s;
  for (uint64_t id : lease_ids) {
    auto it = leases_.find(id);
    if (it == leases_.end() || it->second.session != session)
      return Status::NotFound("unknown lease " + std::to_string(id) + " for this session");
  }
  for (uint64_t id : lease_ids) {
    auto it = leases_.find(id);
    if (it != leases_.end()) DropLease(it);  // (an id listed twice is gone the second time)
  }
  for (uint64_t id : unmapped_buffer_ids) {
    auto b = buffers_.find(id);
    if (b != buffers_.end()) DropMapper(b->second, session);
  }
  return Status::OK();
}

Status Cache::FdFor(const std::string& session, uint64_t buffer_id, int* fd, bool* writable,
                    uint64_t* capacity) {
  MutexLock lock(&mu_);
  Status s = CheckSession(session);
  if (!s.ok()) return s;
  auto it = buffers_.find(buffer_id);
  if (it == buffers_.end() || !it->second.mem)
    return Status::NotFound("unknown buffer " + std::to_string(buffer_id));
  Buf& b = it->second;
  bool owns = b.state == BufState::kPending && pending_.count(b.allocation_id) &&
              pending_[b.allocation_id].session == session;
  bool leased = false;
  if (!owns) {
    for (const auto& [id, l] : leases_)
      if (l.buffer_id == buffer_id && l.session == session) leased = true;
  }
  if (!owns && !leased)
    return Status::PermissionDenied("buffer " + std::to_string(buffer_id) +
                                    " is not allocated to or leased by this session");
  s = b.mem->NewFd(owns, fd);
  if (!s.ok()) return s;
  if (owns) b.mappers.insert(session);
  *writable = owns;
  *capacity = b.capacity;
  return Status::OK();
}

}  // namespace tce
