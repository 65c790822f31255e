#include "cache/session_table.h"

#include <sys/random.h>

#include <cstdio>

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

std::string SessionTable::Open(uid_t uid, pid_t pid, gid_t gid) {
  std::string id = RandomSessionId();
  Session& s = sessions_[id];
  s.uid = uid;
  s.gid = gid;
  s.pid = pid;
  s.last_used = clock_->Now();
  return id;
}

SessionTable::Session* SessionTable::Use(const std::string& id) {
  auto it = sessions_.find(id);
  if (it == sessions_.end()) return nullptr;
  it->second.last_used = clock_->Now();
  return &it->second;
}

Status SessionTable::Check(const std::string& id) {
  if (Use(id)) return Status::OK();
  return Status::Unauthenticated(
      "unknown session '" + id.substr(0, 32) +
      "': open a session on the server's fd socket (<socket>.fd) first");
}

const SessionTable::Session* SessionTable::Find(const std::string& id) const {
  auto it = sessions_.find(id);
  return it == sessions_.end() ? nullptr : &it->second;
}

void SessionTable::Erase(const std::string& id) { sessions_.erase(id); }

std::vector<std::string> SessionTable::Idle(std::chrono::milliseconds idle,
                                            const std::set<std::string>& busy) const {
  const auto now = clock_->Now();
  std::vector<std::string> out;
  for (const auto& [id, s] : sessions_)
    if (s.leases == 0 && !busy.count(id) && now - s.last_used >= idle) out.push_back(id);
  return out;
}

void SessionTable::OweUnmap(const std::string& id, uint64_t buffer_id) {
  auto it = sessions_.find(id);
  if (it != sessions_.end()) it->second.pending_unmap.push_back(buffer_id);
}

void SessionTable::TakeUnmaps(const std::string& id, std::vector<uint64_t>* out) {
  auto it = sessions_.find(id);
  if (it == sessions_.end()) return;
  out->insert(out->end(), it->second.pending_unmap.begin(), it->second.pending_unmap.end());
  it->second.pending_unmap.clear();
}

uint64_t SessionTable::BufferOf(uint64_t lease_id) const {
  auto it = leases_.find(lease_id);
  return it == leases_.end() ? 0 : it->second.buffer_id;
}

Status SessionTable::CanLease(const std::string& id, size_t more) const {
  const Session* s = Find(id);
  if (s && s->leases + more > max_leases_)
    return Status::ResourceExhausted("this session holds " + std::to_string(s->leases) +
                                     " leases (max_leases_per_session=" +
                                     std::to_string(max_leases_) +
                                     "): release loaded files before loading more");
  return Status::OK();
}

uint64_t SessionTable::AddLease(const std::string& id, uint64_t buffer_id) {
  const uint64_t lease_id = next_lease_id_++;
  leases_[lease_id] = Lease{id, buffer_id};
  ++sessions_[id].leases;
  return lease_id;
}

Status SessionTable::CheckLease(const std::string& id, uint64_t lease_id) const {
  auto it = leases_.find(lease_id);
  if (it == leases_.end() || it->second.session != id)
    return Status::NotFound("unknown lease " + std::to_string(lease_id) + " for this session");
  return Status::OK();
}

uint64_t SessionTable::DropLease(uint64_t lease_id) {
  auto it = leases_.find(lease_id);
  if (it == leases_.end()) return 0;
  auto s = sessions_.find(it->second.session);
  if (s != sessions_.end() && s->second.leases > 0) --s->second.leases;
  const uint64_t buffer_id = it->second.buffer_id;
  leases_.erase(it);
  return buffer_id;
}

std::vector<uint64_t> SessionTable::LeasesOf(const std::string& id) const {
  std::vector<uint64_t> out;
  for (const auto& [lease_id, l] : leases_)
    if (l.session == id) out.push_back(lease_id);
  return out;
}

bool SessionTable::Leases(const std::string& id, uint64_t buffer_id) const {
  for (const auto& [lease_id, l] : leases_)
    if (l.buffer_id == buffer_id && l.session == id) return true;
  return false;
}

}  // namespace tce
