#include "cache/version_leases.h"

#include <utility>

namespace tce {
namespace {

template <typename K>
void Drop(std::map<K, size_t>* counts, const K& key) {
  auto it = counts->find(key);
  if (it != counts->end() && --it->second == 0) counts->erase(it);
}

template <typename K>
size_t CountOf(const std::map<K, size_t>& counts, const K& key) {
  auto it = counts.find(key);
  return it == counts.end() ? 0 : it->second;
}

}  // namespace

uint64_t VersionLeases::Add(VersionLease lease) {
  const uint64_t id = next_id_++;
  ++by_session_[lease.session];
  ++by_uid_[lease.uid];
  leases_.emplace(id, std::move(lease));
  return id;
}

VersionLease* VersionLeases::Find(const std::string& session, uint64_t id) {
  auto it = leases_.find(id);
  return it == leases_.end() || it->second.session != session ? nullptr : &it->second;
}

const VersionLease* VersionLeases::Get(uint64_t id) const {
  auto it = leases_.find(id);
  return it == leases_.end() ? nullptr : &it->second;
}

bool VersionLeases::Take(uint64_t id, VersionLease* out) {
  auto it = leases_.find(id);
  if (it == leases_.end()) return false;
  Drop(&by_session_, it->second.session);
  Drop(&by_uid_, it->second.uid);
  *out = std::move(it->second);
  leases_.erase(it);
  return true;
}

std::vector<uint64_t> VersionLeases::Expired(Clock::TimePoint now) const {
  std::vector<uint64_t> out;
  for (const auto& [id, l] : leases_)
    if (l.expires <= now) out.push_back(id);
  return out;
}

std::vector<uint64_t> VersionLeases::OfSession(const std::string& session) const {
  std::vector<uint64_t> out;
  for (const auto& [id, l] : leases_)
    if (l.session == session) out.push_back(id);
  return out;
}

std::vector<uint64_t> VersionLeases::OfJob(const std::string& job) const {
  std::vector<uint64_t> out;
  for (const auto& [id, l] : leases_)
    if (l.job == job) out.push_back(id);
  return out;
}

std::vector<VersionLease> VersionLeases::All() const {
  std::vector<VersionLease> out;
  for (const auto& [id, l] : leases_) out.push_back(l);
  return out;
}

size_t VersionLeases::CountOfSession(const std::string& session) const { return CountOf(by_session_, session); }

size_t VersionLeases::CountOfUid(uid_t uid) const { return CountOf(by_uid_, uid); }

}  // namespace tce
