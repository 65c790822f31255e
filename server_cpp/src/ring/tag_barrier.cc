#include "ring/tag_barrier.h"

#include <algorithm>
#include <map>

#include "common/logging.h"
#include "ring/peer_link.h"
#include "ring/peer_server.h"
#include "tce/v1/tce.pb.h"

namespace tce {

TagBarrier::TagBarrier(RingStore* cache, RingMembers* members, TagBarrierOptions options)
    : cache_(cache), members_(members), options_(std::move(options)) {}

TagBarrier::~TagBarrier() { Stop(); }

void TagBarrier::Start() {
  if (!thread_.joinable()) thread_ = std::thread([this] { Loop(); });
}

void TagBarrier::Stop() {
  {
    MutexLock l(&mu_);
    stop_ = true;
  }
  cv_.SignalAll();
  if (thread_.joinable()) thread_.join();
}

void TagBarrier::Loop() {
  for (;;) {
    CheckOnce();
    const auto deadline = options_.clock->Now() + options_.interval;
    MutexLock l(&mu_);
    while (!stop_ && options_.clock->WaitUntil(&cv_, &mu_, deadline)) {
    }
    if (stop_) return;
  }
}

Status TagBarrier::Ask(const std::string& peer, const std::string& job, const std::vector<std::string>& paths,
                       std::set<std::string>* durable) {
  std::unique_ptr<PeerLink> link;
  Status s = PeerLink::Connect(peer, options_.self, options_.key, options_.io_timeout, &link, options_.breaker);
  uid_t uid = 0;
  const bool owned = members_->JobUid(job, &uid);
  const size_t per_ask = PeerServer::kMaxDurablePaths;
  for (size_t at = 0; s.ok() && at < paths.size(); at += per_ask) {
    const auto first = paths.begin() + at, last = paths.begin() + std::min(paths.size(), at + per_ask);
    v1::PeerRequest req;
    v1::PeerDurable* d = req.mutable_durable();
    d->set_job(job);
    for (auto p = first; p != last; ++p) d->add_paths(*p);
    if (owned) d->set_job_uid(uid);
    v1::PeerDurableReply reply;
    s = link->Send(req);
    if (s.ok()) s = link->Recv(&reply);
    if (s.ok() && reply.code() != 0)
      s = Status::FromCode(static_cast<Status::Code>(reply.code()), reply.message().substr(0, 1024));
    if (!s.ok()) break;
    for (const std::string& p : reply.durable())
      if (std::binary_search(first, last, p)) durable->insert(p);  // only what was asked: a peer's answer is checked
  }
  return s;
}

void TagBarrier::CheckOnce() {
  std::vector<RingStore::HeldMarker> held = cache_->MarkersAwaitingPeers();
  if (held.empty()) return;
  std::map<std::string, std::set<std::string>> by_job;  // the remote files to ask about, per job
  for (const auto& m : held) by_job[m.key.first].insert(m.remote.begin(), m.remote.end());
  std::map<std::string, std::set<std::string>> durable;
  for (const auto& [job, files] : by_job) {
    const std::vector<std::string> paths(files.begin(), files.end());
    for (const std::string& peer : members_->RingPeers(job)) {
      Status s = Ask(peer, job, paths, &durable[job]);
      if (!s.ok())
        TCE_LOG(kDebug, "ring") << "cannot ask " << peer << " which files of job=" << job
                                << " are durable: " << s.ToString() << " (asked again)";
    }
  }
  for (const auto& m : held) {
    const std::set<std::string>& ok = durable[m.key.first];
    bool all = true;
    for (const std::string& p : m.remote) all = all && ok.count(p);
    if (all) cache_->PeersDurable(m.key, m.version);
  }
}

}  // namespace tce
