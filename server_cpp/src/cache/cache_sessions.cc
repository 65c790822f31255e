// Cache: its side of the sessions (cache/sessions.h). Sessions keeps the
// sessions and their leases; here are what a session holds in the Cache
// (its allocations, the buffers it maps, what its leases pin), ended when
// it closes, and the fds it gets for its buffers (SessionSide, each under
// the Cache's lock); and who may act on which job.
#include "cache/cache.h"

#include "common/logging.h"

namespace tce {

class Cache::SessionSide : public SessionHost {
 public:
  explicit SessionSide(Cache* cache) : c_(cache) {}

  bool EndSession(const std::string& session) override { return c_->CloseSessionHere(session); }
  void SessionEnded(const std::string& session) override {
    c_->publication_->SessionClosed(session);  // its version leases, its waits
  }
  std::set<std::string> BusySessions() override {
    MutexLock lock(&c_->mu_);
    std::set<std::string> busy;
    for (const auto& [id, a] : c_->pending_) busy.insert(a.session);
    return busy;
  }
  Status FdFor(const std::string& session, uint64_t buffer_id, int* fd, bool* writable, uint64_t* capacity,
               bool keep_mapped) override {
    return c_->FdForHere(session, buffer_id, fd, writable, capacity, keep_mapped);
  }

 private:
  Cache* const c_;
};

std::unique_ptr<SessionHost> Cache::MakeSessionSide() { return std::make_unique<SessionSide>(this); }

bool Cache::CloseSessionHere(const std::string& session) {
  MutexLock lock(&mu_);
  const SessionTable::Session* sess = sessions_.Find(session);
  if (!sess) return false;
  const pid_t pid = sess->pid;
  size_t aborted = 0;
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
  const std::vector<uint64_t> leases = sessions_.LeasesOf(session);
  for (uint64_t id : leases) DropLease(id);
  std::vector<uint64_t> ids;
  for (auto& [id, buf] : buffers_) ids.push_back(id);
  for (uint64_t id : ids) {
    auto b = buffers_.find(id);
    if (b != buffers_.end()) DropMapper(b->second, session);
  }
  for (auto& [id, readers] : lent_readers_) readers.erase(session);
  if (pending_.empty()) quiet_cv_.SignalAll();
  done_cv_.SignalAll();  // its blocked calls end (Wait)
  TCE_LOG(kInfo, "session") << "closed session=" << session.substr(0, 8) << " pid=" << pid
                            << " aborted=" << aborted << " leases_dropped=" << leases.size();
  sessions_.Forget(session);
  return true;
}

Status Cache::CheckAccess(const std::string& session, const std::string& job,
                          const std::string& what, bool claim) {
  Status s = sessions_.Check(session);
  if (!s.ok()) return s;
  const SessionTable::Session* who = sessions_.Find(session);
  bool created = false;
  s = claim ? owners_.Claim(who->uid, job, what, who->gid, &created) : owners_.Check(who->uid, job, what);
  if (created) {
    s = quota_.Charge(who->uid, MetadataQuota::JobBytes(job), "job '" + job + "'");
    if (!s.ok()) owners_.Unclaim(job);
  }
  uint64_t dropped = 0;
  if (!s.ok() && refused_log_.Allow(&dropped))
    TCE_LOG(kWarning, "access") << "refused: " << s.message() << Suppressed(dropped);
  return s;
}

void Cache::DropLease(uint64_t lease_id) {
  auto b = buffers_.find(sessions_.DropLease(lease_id));
  if (b != buffers_.end()) {
    --b->second.leases;
    MaybeFree(b->second);
  }
}

void Cache::DropReaders(Buf& buf) {
  OweUnmaps(buf.readers, buf.id);
  buf.readers.clear();
}

void Cache::OweUnmaps(const std::set<std::string>& sessions, uint64_t buffer_id) {
  for (const auto& s : sessions) sessions_.OweUnmap(s, buffer_id);
}

void Cache::DropMapper(Buf& buf, const std::string& session) {
  buf.readers.erase(session);
  if (!buf.mappers.erase(session)) return;
  if (buf.state == BufState::kRetiring && buf.mappers.empty()) {  // its bytes went at retirement
    TCE_LOG(kDebug, "cache") << "retired buffer=" << buf.id << " unmapped by its last mapper";
    buffers_.erase(buf.id);
  }
}

Status Cache::Release(const std::string& session, const std::vector<uint64_t>& lease_ids,
                      const std::vector<uint64_t>& unmapped_buffer_ids) {
  MutexLock lock(&mu_);
  Status s = sessions_.Check(session);
  if (!s.ok()) return s;
  for (uint64_t id : lease_ids) {
    s = sessions_.CheckLease(session, id);
    if (!s.ok()) return s;
  }
  for (uint64_t id : lease_ids) DropLease(id);  // (an id listed twice is gone the second time)
  for (uint64_t id : unmapped_buffer_ids) {
    auto b = buffers_.find(id);
    if (b != buffers_.end()) DropMapper(b->second, session);
  }
  return Status::OK();
}

Status Cache::FdForHere(const std::string& session, uint64_t buffer_id, int* fd, bool* writable,
                        uint64_t* capacity, bool keep_mapped) {
  MutexLock lock(&mu_);
  Status s = sessions_.Check(session);
  if (!s.ok()) return s;
  auto it = buffers_.find(buffer_id);
  if (it == buffers_.end() || !it->second.mem)
    return Status::NotFound("unknown buffer " + std::to_string(buffer_id));
  Buf& b = it->second;
  bool owns = b.state == BufState::kPending && pending_.count(b.allocation_id) &&
              pending_[b.allocation_id].session == session;
  if (!owns && !sessions_.Leases(session, buffer_id))
    return Status::PermissionDenied("buffer " + std::to_string(buffer_id) +
                                    " is not allocated to or leased by this session");
  s = b.mem->NewFd(owns, fd);
  if (!s.ok()) return s;
  const uid_t uid = sessions_.Find(session)->uid;
  if (uid != b.uid && !owners_.IsAdmin(uid)) b.no_reuse = true;  // a granted reader keeps this fd
  if (owns) b.mappers.insert(session);
  else if (keep_mapped) b.readers.insert(session);
  *writable = owns;
  *capacity = b.capacity;
  return Status::OK();
}

}  // namespace tce

namespace tce {

void Cache::RestoreOwner(const std::string& job, uid_t uid, gid_t gid) {
  if (owners_.Restore(job, uid, gid)) quota_.Force(uid, MetadataQuota::JobBytes(job));
}

}  // namespace tce
