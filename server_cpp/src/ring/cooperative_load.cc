// Replicator: the cooperative restore (docs/ring.md). A load that found a
// file neither here nor in any node's memory asks the node the restore plan
// names (ring/restore_plan.h) to read it from storage, and pulls it from
// that node's memory; so a job restarted on empty nodes reads each file of
// its checkpoint from storage once, whichever ranks of whichever nodes load
// it.
#include "common/logging.h"
#include "ring/replicator.h"

namespace tce {

Status Replicator::LoadByPlan(const std::string& job, const std::string& path, bool stage, LoadFrom* from) {
  if (!options_.cooperative) return Status::NotFound("cooperative restore is off");
  if (!cache_->UnderStorage(path)) return Status::NotFound(path + " is not under a storage root");
  const std::vector<std::string> nodes = cache_->RingNodes(job);
  if (nodes.empty()) return Status::NotFound("job " + job + " has no ring of several nodes");
  if (from) *from = LoadFrom::kPeer;
  Status last;
  for (size_t attempt = 0; attempt < nodes.size(); ++attempt) {
    const std::string owner = plans_.OwnerOf(job, nodes, path);
    if (owner.empty()) break;
    // The plan's node answers who reads the file: itself (it began, or
    // prefetches its share), or the first node that asked, which needs it.
    std::string reader;
    Status s;
    if (owner == options_.self) {
      reader = cache_->ClaimRead(job, path, options_.self);
    } else {
      s = PullFrom(owner, job, path, stage, &reader);
      if (s.ok() && reader.empty()) {
        TCE_LOG(kInfo, "ring") << (stage ? "had " : "read ") << "job=" << job << " path=" << path
                               << " read from storage by " << owner << " (the restore plan's node for it)";
        return s;
      }
    }
    if (s.ok() && reader != options_.self) {  // another node reads it: from there
      s = PullFrom(reader, job, path, stage);
      if (s.ok() || s.code() == Status::Code::kFailedPrecondition) return s;
      TCE_LOG(kWarning, "ring") << "the copy of " << path << " from " << reader << ", which read it: " << s.ToString()
                                << "; reading it from storage here";
      break;
    }
    if (s.ok()) break;  // this node reads it
    if (s.code() == Status::Code::kFailedPrecondition) return s;
    if (s.code() == Status::Code::kUnavailable || s.code() == Status::Code::kDeadlineExceeded) {
      plans_.MarkDown(job, owner);  // its share goes to the others
      last = s;
      continue;
    }
    if (s.code() == Status::Code::kDataLoss) {  // corrupt on the way: storage has the bytes
      TCE_LOG(kWarning, "ring") << "the copy of " << path << " from " << owner << ": " << s.ToString()
                                << "; reading it from storage here";
      cache_->NoteBackupError("restore of " + path + " from " + owner + ": " + s.ToString());
      break;
    }
    return s;  // storage has no such file, or the owner could not read it: the load sees why
  }
  if (!last.ok())
    TCE_LOG(kInfo, "ring") << "no other node of job=" << job << " reads " << path << " (" << last.ToString()
                           << "): reading it from storage here";
  if (from) *from = LoadFrom::kStorage;
  return cache_->LoadFromStorage(job, path, /*for_peer=*/false);
}

Status Replicator::OnLink(const std::string& peer, const std::function<Status(PeerLink*)>& fn) {
  // Few: each kept link holds its lanes' connections on the peer, within
  // the peer's peer_max_connections that its backups need too.
  constexpr size_t kIdlePerPeer = 2, kIdle = 16;
  for (int attempt = 0;; ++attempt) {
    std::unique_ptr<PeerLink> link;
    {
      MutexLock l(&pool_mu_);
      auto it = pool_.find(peer);
      if (it != pool_.end() && !it->second.empty()) {
        link = std::move(it->second.back());
        it->second.pop_back();
      }
    }
    const bool kept = link != nullptr;
    if (!kept) {
      Status c = Connect(peer, &link);
      if (!c.ok()) return c;
    }
    Status s = fn(link.get());
    const bool in_step = s.ok() || s.code() == Status::Code::kNotFound || s.code() == Status::Code::kFailedPrecondition;
    if (in_step) {
      MutexLock l(&pool_mu_);
      size_t total = 0;
      for (const auto& [p, links] : pool_) total += links.size();
      std::vector<std::unique_ptr<PeerLink>>& idle = pool_[peer];
      if (idle.size() < kIdlePerPeer && total < kIdle) idle.push_back(std::move(link));
      return s;
    }
    if (!kept || attempt > 0 || s.code() != Status::Code::kUnavailable) return s;
  }
}

Status Replicator::PullFrom(const std::string& node, const std::string& job, const std::string& path, bool stage,
                            std::string* reader) {
  Status s = OnLink(node, [&](PeerLink* link) {
    return Pull(link, job, node, path, stage ? PullMode::kStage : PullMode::kLoad, reader);
  });
  if (s.code() == Status::Code::kDataLoss)
    cache_->NoteBackupError("restore of " + path + " from " + node + ": " + s.ToString());
  return s;
}

namespace {
constexpr size_t kMaxPrefetches = 64;
}  // namespace

bool Replicator::Prefetch(const std::string& job, const std::string& dir, std::vector<std::string> paths,
                          bool only_if_empty) {
  if (!options_.prefetch || !options_.cooperative || cache_->RingNodes(job).empty()) return false;
  MutexLock l(&mu_);
  if (stop_ || prefetches_.size() >= kMaxPrefetches) return false;
  for (const PrefetchJob& p : prefetches_)
    if (p.job == job && p.dir == dir && p.paths == paths) return false;
  prefetches_.push_back({job, dir, std::move(paths), only_if_empty});
  cv_.SignalAll();
  return true;
}

void Replicator::PrefetchLoop() {
  for (;;) {
    PrefetchJob p;
    {
      MutexLock l(&mu_);
      while (!stop_ && prefetches_.empty()) cv_.Wait(&mu_);
      if (stop_) return;
      p = std::move(prefetches_.front());
      prefetches_.pop_front();
    }
    RunPrefetch(p);
  }
}

void Replicator::RunPrefetch(const PrefetchJob& p) {
  if (p.only_if_empty && cache_->InMemoryCount(p.job) > 0) return;  // not a restart
  const std::vector<std::string> nodes = cache_->RingNodes(p.job);
  if (nodes.empty()) return;
  std::vector<std::string> paths = p.paths;
  if (paths.empty()) {
    std::vector<ListedObject> listed;
    Status s = cache_->ListStorageDir(p.job, p.dir, &listed);
    if (!s.ok()) {
      TCE_LOG(kWarning, "ring") << "prefetch of " << p.dir << " for job=" << p.job << ": " << s.ToString();
      return;
    }
    for (const ListedObject& o : listed) paths.push_back(o.key);
  }
  size_t mine = 0, read = 0;
  for (const std::string& path : paths) {
    {
      MutexLock l(&mu_);
      if (stop_) return;
    }
    if (!cache_->UnderStorage(path) || plans_.OwnerOf(p.job, nodes, path) != options_.self) continue;
    ++mine;
    if (cache_->ClaimRead(p.job, path, options_.self) != options_.self) continue;  // a node that needs it reads it
    Status s = cache_->LoadFromStorage(p.job, path, /*for_peer=*/false);
    if (s.ok()) {
      ++read;
    } else {
      TCE_LOG(kWarning, "ring") << "prefetch of job=" << p.job << " path=" << path << ": " << s.ToString();
    }
  }
  TCE_LOG(kInfo, "ring") << "prefetched " << read << " of the " << mine << " file(s) this node reads of "
                         << paths.size() << " for job=" << p.job << (p.dir.empty() ? "" : " in " + p.dir);
}

}  // namespace tce
