// Replicator: the cooperative restore (docs/ring.md). A load that found a
// file neither here nor in any node's memory asks the node the restore plan
// names (ring/restore_plan.h) to read it from storage, and pulls it from
// that node's memory; so a job restarted on empty nodes reads each file of
// its checkpoint from storage once, whichever ranks of whichever nodes load
// it. A node that stops answering is marked down for the job and its claims
// dropped, and no load waits on a peer past its caller's deadline.
#include <algorithm>
#include <map>

#include "common/logging.h"
#include "ring/replicator.h"

namespace tce {

Status Replicator::FetchForLoad(const std::string& job, const std::string& path, LoadFrom* from,
                                Clock::TimePoint deadline) {
  if (from) *from = LoadFrom::kPeer;
  Status here = PullHeld(job, path);
  if (here.ok() || here.code() == Status::Code::kFailedPrecondition) {
    TCE_LOG(kInfo, "ring") << "read job=" << job << " path=" << path << " from the copy held here";
    return here;
  }
  if (here.code() != Status::Code::kNotFound)
    TCE_LOG(kWarning, "ring") << "the copy of " << path << " held here: " << here.ToString();
  Status last = Status::NotFound(path + " is held by no peer of job " + job);
  for (const std::string& peer : members_->RingPeers(job)) {
    if (plans_.IsDown(job, peer)) continue;  // it did not answer a moment ago
    Status s = OnLink(peer, [&](PeerLink* link) { return Pull(link, job, peer, path); }, deadline);
    if (s.ok() || s.code() == Status::Code::kFailedPrecondition) {
      TCE_LOG(kInfo, "ring") << "remote read of job=" << job << " path=" << path << " from " << peer;
      return s;
    }
    if (s.code() == Status::Code::kUnavailable || s.code() == Status::Code::kDeadlineExceeded) {
      TCE_LOG(kWarning, "ring") << "remote read of " << path << " from " << peer << ": " << s.ToString();
      Status gone = PeerFailedLoad(job, path, peer, "a ring member", s, deadline);
      if (!gone.ok()) return gone;  // unreachable, or silent: the next one
    } else if (s.code() != Status::Code::kNotFound) {
      TCE_LOG(kWarning, "ring") << "remote read of " << path << " from " << peer << ": " << s.ToString();
      backups_->NoteBackupError("remote read of " + path + ": " + s.ToString());
      last = s;
    }
  }
  // In no node's memory: read from storage once for the whole ring.
  Status planned = LoadByPlan(job, path, /*stage=*/false, from, deadline);
  return planned.code() == Status::Code::kNotFound ? last : planned;
}

Status Replicator::PeerFailedLoad(const std::string& job, const std::string& path, const std::string& peer,
                                  const std::string& as, const Status& s, Clock::TimePoint deadline) {
  if (options_.clock->Now() >= deadline)  // cut short by the caller: it may only be slow
    return Status::DeadlineExceeded("the load of " + path + " waited for " + peer + " (" + as + " of job " + job +
                                    ") until the caller's deadline: " + s.message());
  MarkPeerDown(job, peer);
  return Status::OK();
}

void Replicator::MarkPeerDown(const std::string& job, const std::string& peer) {
  plans_.MarkDown(job, peer);  // asked nothing for a while, its share read by the others
  const size_t dropped = loads_->DropClaims(job, peer);
  if (dropped > 0)
    TCE_LOG(kWarning, "ring") << "dropped " << dropped << " claim(s) of " << peer << " on files of job=" << job
                              << ": it stopped answering; the next node that asks reads them";
}

Status Replicator::LoadByPlan(const std::string& job, const std::string& path, bool stage, LoadFrom* from,
                              Clock::TimePoint deadline) {
  if (!options_.cooperative) return Status::NotFound("cooperative restore is off");
  if (!loads_->UnderStorage(path)) return Status::NotFound(path + " is not under a storage root");
  const std::vector<std::string> nodes = members_->RingNodes(job);
  if (nodes.empty()) return Status::NotFound("job " + job + " has no ring of several nodes");
  if (from) *from = LoadFrom::kPeer;
  Status last;
  std::string down;  // a reader found down, told to the plan's node with the next question
  // Each node at most once as the plan's node or as the reader found down.
  for (size_t attempt = 0; attempt < 2 * nodes.size(); ++attempt) {
    const std::string owner = plans_.OwnerOf(job, nodes, path);
    if (owner.empty()) break;
    // The plan's node answers who reads the file: itself (it began, or
    // prefetches its share), or the first node that asked, which needs it.
    std::string reader;
    Status s;
    if (owner == options_.self) {
      if (!down.empty()) loads_->DropClaims(job, down);
      reader = loads_->ClaimRead(job, path, options_.self);
    } else {
      s = PullFrom(owner, job, path, stage, &reader, deadline, down);
      if (s.ok() && reader.empty()) {
        TCE_LOG(kInfo, "ring") << (stage ? "had " : "read ") << "job=" << job << " path=" << path
                               << " read from storage by " << owner << " (the restore plan's node for it)";
        return s;
      }
    }
    down.clear();
    if (s.ok() && reader != options_.self && plans_.IsDown(job, reader)) {
      down = reader;  // a claim of a node that stopped answering: ask again, saying so
      continue;
    }
    if (s.ok() && reader != options_.self) {  // another node reads it: from there
      s = PullFrom(reader, job, path, stage, nullptr, deadline);
      if (s.ok() || s.code() == Status::Code::kFailedPrecondition) return s;
      if (s.code() == Status::Code::kUnavailable || s.code() == Status::Code::kDeadlineExceeded) {
        Status gone = PeerFailedLoad(job, path, reader, "the node that reads it", s, deadline);
        if (!gone.ok()) return gone;
        down = reader;  // its claims go at the plan's node too; someone else reads it
        last = s;
        continue;
      }
      TCE_LOG(kWarning, "ring") << "the copy of " << path << " from " << reader << ", which read it: " << s.ToString()
                                << "; reading it from storage here";
      break;
    }
    if (s.ok()) break;  // this node reads it
    if (s.code() == Status::Code::kFailedPrecondition) return s;
    if (s.code() == Status::Code::kUnavailable || s.code() == Status::Code::kDeadlineExceeded) {
      Status gone = PeerFailedLoad(job, path, owner, "the restore plan's node for it", s, deadline);
      if (!gone.ok()) return gone;
      last = s;  // its share goes to the others
      continue;
    }
    if (s.code() == Status::Code::kDataLoss) {  // corrupt on the way: storage has the bytes
      TCE_LOG(kWarning, "ring") << "the copy of " << path << " from " << owner << ": " << s.ToString()
                                << "; reading it from storage here";
      backups_->NoteBackupError("restore of " + path + " from " + owner + ": " + s.ToString());
      break;
    }
    return s;  // storage has no such file, or the owner could not read it: the load sees why
  }
  if (!last.ok())
    TCE_LOG(kInfo, "ring") << "no other node of job=" << job << " reads " << path << " (" << last.ToString()
                           << "): reading it from storage here";
  if (from) *from = LoadFrom::kStorage;
  return loads_->LoadFromStorage(job, path, /*for_peer=*/false);
}

Status Replicator::OnLink(const std::string& peer, const std::function<Status(PeerLink*)>& fn,
                          Clock::TimePoint deadline) {
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
      Status c = Connect(peer, &link, deadline);
      if (!c.ok()) return c;
    }
    if (deadline != Clock::TimePoint::max())  // the link's clock is the real one
      link->SetDeadline(Clock::Real()->Now() + (deadline - options_.clock->Now()));
    Status s = fn(link.get());
    link->ClearDeadline();
    const bool in_step = s.ok() || s.code() == Status::Code::kNotFound || s.code() == Status::Code::kFailedPrecondition;
    if (in_step) {
      MutexLock l(&pool_mu_);
      size_t total = 0;
      for (const auto& [p, links] : pool_) total += links.size();
      std::vector<std::unique_ptr<PeerLink>>& idle = pool_[peer];
      if (idle.size() < kIdlePerPeer && total < kIdle) idle.push_back(std::move(link));
      return s;
    }
    // A kept link that failed at once: the peer may have restarted. One
    // that waited out a timeout: the peer stopped answering.
    if (!kept || attempt > 0 || s.code() != Status::Code::kUnavailable || link->timed_out() ||
        options_.clock->Now() >= deadline)
      return s;
  }
}

Status Replicator::PullFrom(const std::string& node, const std::string& job, const std::string& path, bool stage,
                            std::string* reader, Clock::TimePoint deadline, const std::string& down) {
  Status s = OnLink(node, [&](PeerLink* link) {
    return Pull(link, job, node, path, stage ? PullMode::kStage : PullMode::kLoad, reader, down);
  }, deadline);
  if (s.code() == Status::Code::kDataLoss)
    backups_->NoteBackupError("restore of " + path + " from " + node + ": " + s.ToString());
  return s;
}

bool Replicator::Prefetch(const std::string& job, const std::string& dir, std::vector<std::string> paths,
                          bool only_if_empty) {
  if (!options_.prefetch || !options_.cooperative || members_->RingNodes(job).empty()) return false;
  // What lies under no storage root is never read from storage (a memory
  // only server's files, a directory outside the roots): nothing to queue,
  // and nothing wrong to log.
  auto unstored = [&](const std::string& path) { return !loads_->UnderStorage(path); };
  paths.erase(std::remove_if(paths.begin(), paths.end(), unstored), paths.end());
  if (paths.empty() && (dir.empty() || !loads_->UnderStorage(dir + "/x"))) return false;  // x: a file in `dir`
  uid_t uid = 0;  // the job's owner's share of the queue
  if (!members_->JobUid(job, &uid)) return false;
  PrefetchJob p;
  p.job = job;
  p.dir = dir;
  p.paths = std::move(paths);
  p.only_if_empty = only_if_empty;
  return prefetches_.Add(uid, std::move(p));
}

void Replicator::PrefetchLoop() {
  uid_t uid = 0;
  PrefetchJob p;
  while (prefetches_.Take(&uid, &p)) {
    const bool finished = PrefetchStep(uid, &p);
    if (finished) p.shown.End();  // off tce status now, not when the next one is taken
    prefetches_.Done(uid, &p, finished);
  }
}

namespace {

// The directory all of `paths` lie in ("" when they lie in several).
std::string CommonDir(const std::vector<std::string>& paths) {
  std::string dir;
  for (const std::string& path : paths) {
    const size_t slash = path.rfind('/');
    const std::string d = slash == std::string::npos ? "" : path.substr(0, slash);
    if (&path != &paths.front() && d != dir) return "";
    dir = d;
  }
  return dir;
}

std::string BaseName(const std::string& dir) {
  const size_t slash = dir.rfind('/');
  return slash == std::string::npos ? dir : dir.substr(slash + 1);
}

}  // namespace

bool Replicator::PrefetchStep(uid_t uid, PrefetchJob* p) {
  if (!p->started) {
    p->started = true;
    if (p->only_if_empty && recovery_->InMemoryCount(p->job) > 0) return true;  // not a restart
    const std::string dir = p->paths.empty() ? p->dir : CommonDir(p->paths);
    p->shown = progress_.Begin(ProgressBoard::kPrefetch, p->job, BaseName(dir), "", uid);
    std::vector<ListedObject> listed;  // the sizes of this node's share (one listing: this step)
    if (p->paths.empty()) {
      Status s = loads_->ListStorageDir(p->job, p->dir, &listed);
      uint64_t dropped = 0;
      if (!s.ok() && prefetch_log_.Allow(&dropped))
        TCE_LOG(kWarning, "ring") << "prefetch of " << p->dir << " for job=" << p->job << ": " << s.ToString()
                                  << Suppressed(dropped);
      if (!s.ok()) return true;
      for (const ListedObject& o : listed) p->paths.push_back(o.key);
    } else if (!dir.empty() && loads_->UnderStorage(dir + "/x")) {  // x: a file in `dir`
      if (!loads_->ListStorageDir(p->job, dir, &listed).ok()) listed.clear();  // the sizes stay unknown
    }
    // This node's share, as the plan of the one directory names it (the
    // same plan the reads ask next); named paths in several directories
    // would cost a listing each here: their total is not shown.
    const std::vector<std::string> nodes = members_->RingNodes(p->job);
    if (!dir.empty() && !nodes.empty()) {
      std::map<std::string, uint64_t> sizes;
      for (const ListedObject& o : listed) sizes[o.key] = o.size;
      uint64_t files = 0, bytes = 0;
      for (const std::string& path : p->paths) {
        if (!loads_->UnderStorage(path) || plans_.OwnerOf(p->job, nodes, path) != options_.self) continue;
        ++files;
        auto it = sizes.find(path);
        if (it != sizes.end()) bytes += it->second;
        p->sizes.push_back(it != sizes.end() ? it->second : 0);
      }
      p->shown.SetTotal(files, sizes.empty() ? 0 : bytes);
    }
    return false;  // the files, from the next step on
  }
  const std::vector<std::string> nodes = members_->RingNodes(p->job);
  if (nodes.empty()) return true;
  while (p->next < p->paths.size()) {  // the next file of this node's share; one read per step
    if (prefetches_.stopped()) return true;
    const std::string& path = p->paths[p->next++];
    if (!loads_->UnderStorage(path) || plans_.OwnerOf(p->job, nodes, path) != options_.self) continue;
    const uint64_t size = p->mine < p->sizes.size() ? p->sizes[p->mine] : 0;
    ++p->mine;
    if (loads_->ClaimRead(p->job, path, options_.self) != options_.self) {  // a node that needs it reads it
      p->shown.AddDone(1, size);
      continue;
    }
    Status s = loads_->LoadFromStorage(p->job, path, /*for_peer=*/false);
    if (s.ok()) {
      ++p->read;
    } else if (p->failed++ == 0) {
      p->first_error = path + ": " + s.ToString();
    }
    p->shown.AddDone(1, s.ok() ? size : 0, s.ok() ? 0 : 1);
    if (p->next < p->paths.size()) return false;
  }
  const std::string what = "prefetched " + std::to_string(p->read) + " of the " + std::to_string(p->mine) +
                           " file(s) this node reads of " + std::to_string(p->paths.size()) + " for job=" + p->job +
                           (p->dir.empty() ? "" : " in " + p->dir);
  uint64_t dropped = 0;  // one line for all it could not read, and a few lines however many prefetches
  if (!prefetch_log_.Allow(&dropped)) return true;
  if (p->failed == 0)
    TCE_LOG(kInfo, "ring") << what << Suppressed(dropped);
  else
    TCE_LOG(kWarning, "ring") << what << "; " << p->failed << " could not be read (the first: " << p->first_error
                              << ")" << Suppressed(dropped);
  return true;
}

}  // namespace tce
