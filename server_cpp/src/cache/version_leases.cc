#include "cache/version_leases.h"

#include <utility>

namespace tce {

uint64_t VersionLeases::Add(VersionLease lease) {
  const uint64_t id = next_id_++;
  leases_.emplace(id, std::move(lease));
  return id;
}

VersionLease* VersionLeases::Find(const std::string& session, uint64_t id) {
  auto it = leases_.find(id);
  return it == leases_.end() || it->second.session != session ? nullptr : &it->second;
}

bool VersionLeases::Take(uint64_t id, VersionLease* out) {
  auto it = leases_.find(id);
  if (it == leases_.end()) return false;
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

}  // namespace tce
