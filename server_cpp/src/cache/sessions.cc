#include "cache/sessions.h"

#include "cache/job_owners.h"
#include "common/logging.h"

namespace tce {

Sessions::Sessions(const SessionLimits& limits, SessionHost* host, Clock* clock)
    : host_(host), root_is_admin_(limits.root_is_admin), table_(clock) {
  MutexLock lock(&mu_);
  table_.set_max_leases(limits.max_leases_per_session);
}

std::string Sessions::OpenSession(uid_t uid, pid_t pid, gid_t gid) {
  std::string id;
  {
    MutexLock lock(&mu_);
    id = table_.Open(uid, pid, gid);
  }
  TCE_LOG(kInfo, "session") << "opened session=" << id.substr(0, 8) << " uid=" << uid << " pid=" << pid;
  return id;
}

void Sessions::CloseSession(const std::string& session) {
  if (host_->EndSession(session)) host_->SessionEnded(session);
}

std::vector<std::string> Sessions::IdleSessions(std::chrono::milliseconds idle) {
  // (A session that allocates between the two steps was used then: not idle.)
  const std::set<std::string> busy = host_->BusySessions();
  MutexLock lock(&mu_);
  return table_.Idle(idle, busy);
}

Status Sessions::CheckCaller(const std::string& session, bool* admin, uid_t* uid) {
  MutexLock lock(&mu_);
  Status s = table_.Check(session);
  if (!s.ok()) return s;
  const uid_t caller = table_.Find(session)->uid;
  *admin = JobOwners::AdminRule(root_is_admin_, caller);
  if (uid) *uid = caller;
  return s;
}

Status Sessions::CallerIds(const std::string& session, uid_t* uid, gid_t* gid) {
  MutexLock lock(&mu_);
  Status s = table_.Check(session);
  if (!s.ok()) return s;
  const SessionTable::Session* sess = table_.Find(session);
  *uid = sess->uid;
  *gid = sess->gid;
  return s;
}

Status Sessions::FdFor(const std::string& session, uint64_t buffer_id, int* fd, bool* writable,
                       uint64_t* capacity, bool keep_mapped) {
  return host_->FdFor(session, buffer_id, fd, writable, capacity, keep_mapped);
}

Status Sessions::Check(const std::string& id) {
  MutexLock lock(&mu_);
  return table_.Check(id);
}

const SessionTable::Session* Sessions::Find(const std::string& id) const {
  MutexLock lock(&mu_);
  return table_.Find(id);
}

void Sessions::Forget(const std::string& id) {
  MutexLock lock(&mu_);
  table_.Erase(id);
}

void Sessions::OweUnmap(const std::string& id, uint64_t buffer_id) {
  MutexLock lock(&mu_);
  table_.OweUnmap(id, buffer_id);
}

void Sessions::TakeUnmaps(const std::string& id, std::vector<uint64_t>* out) {
  MutexLock lock(&mu_);
  table_.TakeUnmaps(id, out);
}

Status Sessions::CanLease(const std::string& id, size_t more) const {
  MutexLock lock(&mu_);
  return table_.CanLease(id, more);
}

uint64_t Sessions::AddLease(const std::string& id, uint64_t buffer_id) {
  MutexLock lock(&mu_);
  return table_.AddLease(id, buffer_id);
}

Status Sessions::CheckLease(const std::string& id, uint64_t lease_id) const {
  MutexLock lock(&mu_);
  return table_.CheckLease(id, lease_id);
}

uint64_t Sessions::DropLease(uint64_t lease_id) {
  MutexLock lock(&mu_);
  return table_.DropLease(lease_id);
}

std::vector<uint64_t> Sessions::LeasesOf(const std::string& id) const {
  MutexLock lock(&mu_);
  return table_.LeasesOf(id);
}

uint64_t Sessions::BufferOf(uint64_t lease_id) const {
  MutexLock lock(&mu_);
  return table_.BufferOf(lease_id);
}

bool Sessions::Leases(const std::string& id, uint64_t buffer_id) const {
  MutexLock lock(&mu_);
  return table_.Leases(id, buffer_id);
}

size_t Sessions::size() const {
  MutexLock lock(&mu_);
  return table_.size();
}

size_t Sessions::leases() const {
  MutexLock lock(&mu_);
  return table_.leases();
}

}  // namespace tce
