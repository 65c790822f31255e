// LoadSplit: where each job's loads took their bytes from on this node (its
// memory, another node's over the ring, storage), so a restore shows that
// each byte was read from storage once (docs/ring.md, tce status, the
// tce_load_bytes_total metric). Bounded: past kMaxJobs jobs the one that
// loaded least recently goes. Thread-safe.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "common/mutex.h"

namespace tce {

enum class LoadFrom { kCache, kPeer, kStorage };

struct JobLoadSplit {
  std::string job;
  uint64_t cache_bytes = 0, peer_bytes = 0, storage_bytes = 0;
  uint64_t peer_files = 0, storage_files = 0;
  uint64_t for_peers_bytes = 0;  // of storage_bytes: read because another node's plan named this one
  uint64_t last = 0;             // orders jobs by their last load
};

class LoadSplit {
 public:
  static constexpr size_t kMaxJobs = 256;

  void Note(const std::string& job, LoadFrom from, uint64_t bytes, bool for_peer = false) {
    MutexLock l(&mu_);
    JobLoadSplit& j = jobs_[job];
    j.job = job;
    j.last = ++clock_;
    switch (from) {
      case LoadFrom::kCache: j.cache_bytes += bytes; break;
      case LoadFrom::kPeer: j.peer_bytes += bytes; ++j.peer_files; break;
      case LoadFrom::kStorage:
        j.storage_bytes += bytes;
        ++j.storage_files;
        if (for_peer) j.for_peers_bytes += bytes;
        break;
    }
    if (jobs_.size() > kMaxJobs) {
      auto oldest = jobs_.begin();
      for (auto it = jobs_.begin(); it != jobs_.end(); ++it)
        if (it->second.last < oldest->second.last) oldest = it;
      jobs_.erase(oldest);
    }
  }

  std::vector<JobLoadSplit> All() const {
    MutexLock l(&mu_);
    std::vector<JobLoadSplit> out;
    for (const auto& [job, j] : jobs_) out.push_back(j);
    return out;
  }

 private:
  mutable Mutex mu_;
  std::map<std::string, JobLoadSplit> jobs_ GUARDED_BY(mu_);
  uint64_t clock_ GUARDED_BY(mu_) = 0;
};

}  // namespace tce
