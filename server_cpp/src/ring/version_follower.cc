// VersionFollower: following jobs (ring/version_follower.h): who follows
// what, the questions to the sources and the versions they answer.
// (The versions' files: version_transfers.cc.)
#include "ring/version_follower.h"

#include <algorithm>

#include "cache/tag_proto.h"
#include "common/logging.h"
#include "common/validate.h"
#include "ring/peer_link.h"
#include "tce/v1/tce.pb.h"

namespace tce {

namespace {

constexpr size_t kMaxGrantedNodes = 1024;  // as many as one GrantRead may name

// The nodes a source says the job's owner granted, checked as any peer's
// words are (bounded, each an endpoint).
Status GrantedNodes(const std::string& source, const v1::PeerVersionReply& reply, std::vector<std::string>* out) {
  if (static_cast<size_t>(reply.nodes_size()) > kMaxGrantedNodes)
    return Status::DataLoss(source + " named " + std::to_string(reply.nodes_size()) + " granted nodes (at most " +
                            std::to_string(kMaxGrantedNodes) + ")");
  out->clear();
  for (const std::string& n : reply.nodes()) {
    Status s = ValidateText("nodes", n, kMaxEndpointBytes, false);
    if (!s.ok()) return Status::DataLoss(source + " named a bad granted node: " + s.message());
    out->push_back(n);
  }
  return Status::OK();
}

}  // namespace

VersionFollower::VersionFollower(PeerVersions* cache, NodeGrants* grants, RangeReader* ranges,
                                 VersionFollowerOptions options)
    : cache_(cache), grants_(grants), ranges_(ranges), options_(std::move(options)) {}

VersionFollower::~VersionFollower() { Stop(); }

void VersionFollower::Stop() {
  std::vector<std::thread> threads;
  {
    MutexLock lock(&mu_);
    stopping_ = true;
    changed_.SignalAll();
    for (auto& [job, j] : jobs_)
      if (j.watcher.joinable()) threads.push_back(std::move(j.watcher));
    for (auto& [id, t] : pulls_) threads.push_back(std::move(t));
    pulls_.clear();
  }
  for (std::thread& t : threads) t.join();  // each ends with its question or transfer (the breaker cuts it)
}

bool VersionFollower::Follows(const std::string& job) {
  MutexLock lock(&mu_);
  return jobs_.count(job) != 0;
}

void VersionFollower::Learned(Job* j, const TagInfo& tag) {
  if (tag.epoch != j->epoch) {  // the source's numbering started afresh: lower numbers are newer
    j->epoch = tag.epoch;
    j->newest = tag.version;
  } else {
    j->newest = std::max(j->newest, tag.version);
  }
}

Status VersionFollower::Ask(const std::string& source, const std::string& job, uint64_t after, uint64_t epoch,
                            std::chrono::milliseconds hold, std::chrono::milliseconds timeout, TagInfo* out,
                            std::vector<std::string>* nodes) {
  std::unique_ptr<PeerLink> link;
  Status s = PeerLink::Connect(source, options_.self, options_.key, timeout, &link, options_.breaker);
  if (!s.ok()) return Status::Unavailable(source + ": " + s.message());
  v1::PeerRequest req;
  v1::PeerVersion* v = req.mutable_version();
  v->set_job(job);
  v->set_after(after);
  v->set_wait_ms(static_cast<uint32_t>(hold.count()));
  v->set_epoch(epoch);
  v1::PeerVersionReply reply;
  s = link->Send(req);
  if (s.ok()) s = link->Recv(&reply);
  if (!s.ok()) return Status::Unavailable(source + ": " + s.message());
  if (reply.code() == static_cast<int>(Status::Code::kDeadlineExceeded)) {  // held: nothing newer yet
    s = GrantedNodes(source, reply, nodes);
    if (!s.ok()) return s;
  }
  if (reply.code() != 0) {
    const auto code = static_cast<Status::Code>(reply.code());
    const bool known = code == Status::Code::kNotFound || code == Status::Code::kPermissionDenied ||
                       code == Status::Code::kDeadlineExceeded;
    return Status::FromCode(known ? code : Status::Code::kUnavailable, source + ": " + reply.message().substr(0, 1024));
  }
  s = CheckTag(reply.tag(), "tag");  // a peer's tag: hostile until checked
  if (!s.ok()) return Status::DataLoss(source + " sent a bad version: " + s.message());
  *out = TagFromProto(reply.tag());
  if (out->job != job || (out->epoch == epoch && out->version <= after))
    return Status::DataLoss(source + " answered with version " + std::to_string(out->version) + " of job '" +
                            out->job + "' for a version of job '" + job + "' above " + std::to_string(after));
  return GrantedNodes(source, reply, nodes);
}

Status VersionFollower::Admit(const std::string& job, uid_t uid) {
  auto it = jobs_.find(job);
  if (it != jobs_.end() && it->second.users.count(uid)) return Status::OK();
  size_t mine = 0;
  for (const auto& [name, j] : jobs_) mine += j.users.count(uid);
  if (mine >= options_.max_jobs_per_uid)
    return Status::ResourceExhausted("uid " + std::to_string(uid) + " follows " + std::to_string(mine) +
                                     " jobs already (max_follows_per_uid)");
  if (it == jobs_.end() && jobs_.size() >= options_.max_jobs)
    return Status::ResourceExhausted("this server follows " + std::to_string(jobs_.size()) +
                                     " jobs already (max_follows)");
  return Status::OK();
}

Status VersionFollower::Follow(const std::string& job, std::vector<std::string> sources, uid_t uid,
                               Clock::TimePoint deadline, TagInfo* newest) {
  if (sources.empty()) return Status::InvalidArgument("name the nodes to follow job '" + job + "' from");
  {
    MutexLock lock(&mu_);  // before any source is asked (and again below)
    Status s = Admit(job, uid);
    if (!s.ok()) return s;
  }
  // The sources decide whether this node may read the job's versions.
  Status last = Status::Unavailable("no source answered");
  *newest = TagInfo();
  std::vector<std::string> nodes;
  bool known = false;
  std::string asked;  // what the sources said, for a deadline that passes
  for (const std::string& source : sources) {
    const std::chrono::milliseconds left = options_.clock->Left(deadline);
    if (left.count() == 0)
      return Status::DeadlineExceeded("following job '" + job + "': the call's deadline passed before a source "
                                      "answered" + (asked.empty() ? std::string() : " (" + asked + ")"));
    TagInfo tag;
    Status s = Ask(source, job, 0, 0, std::chrono::milliseconds(0), std::min(options_.io_timeout, left), &tag,
                   &nodes);
    if (s.code() == Status::Code::kPermissionDenied) return s;
    if (!s.ok()) asked += (asked.empty() ? "" : "; ") + s.message();
    // DEADLINE_EXCEEDED is the source's own answer (Ask makes our timeouts
    // UNAVAILABLE): it knows the job and granted this node, and has no
    // version yet. As NOT_FOUND: followed all the same, the watcher then
    // holds a question there for the first version.
    if (s.code() == Status::Code::kDeadlineExceeded) s = Status::NotFound(s.message());
    last = s;
    if (s.ok()) {
      *newest = tag;
      known = true;
      break;
    }
    // NOT_FOUND: nothing published there yet (or not that job); the next one.
  }
  if (!known && last.code() != Status::Code::kNotFound && options_.clock->Left(deadline).count() == 0)
    return Status::DeadlineExceeded("following job '" + job + "': the call's deadline passed before a source "
                                    "answered (" + asked + ")");
  if (!known && last.code() != Status::Code::kNotFound) return last;
  MutexLock lock(&mu_);  // (the cache's lock is taken inside this one)
  if (stopping_) return Status::Unavailable("the server is shutting down");
  Status s = Admit(job, uid);
  if (s.ok()) s = grants_->AddFollower(job, options_.owner, uid);
  if (s.ok() && known) {
    grants_->PassOnGrants(job, nodes);
    s = cache_->AdoptFollowed(*newest);
  }
  if (!s.ok()) return s;
  auto it = jobs_.find(job);
  if (it != jobs_.end()) {
    for (std::string& src : sources)
      if (std::find(it->second.sources.begin(), it->second.sources.end(), src) == it->second.sources.end())
        it->second.sources.push_back(std::move(src));
    Job& j = it->second;
    j.users.insert(uid);
    if (known) {  // a source answered
      Learned(&j, *newest);
      j.failures = 0;
      j.last_error.clear();
    }
    j.retry_at = options_.clock->Now();  // a failing watcher asks again now (a source may be new)
    changed_.SignalAll();
    return Status::OK();
  }
  Job& j = jobs_[job];
  j.sources = std::move(sources);
  j.users.insert(uid);
  if (known) Learned(&j, *newest);
  j.watcher = std::thread(&VersionFollower::Watch, this, job);
  TCE_LOG(kInfo, "weights") << "following job=" << job << " from " << j.sources.size()
                            << " source(s) for uid " << uid << "; newest version " << newest->version;
  return Status::OK();
}

Status VersionFollower::Round(const std::string& job, const std::vector<std::string>& sources, uint64_t after,
                              uint64_t epoch) {
  std::string why;
  for (const std::string& source : sources) {
    TagInfo tag;
    std::vector<std::string> nodes;
    const Clock::TimePoint asked = options_.clock->Now();
    Status s = Ask(source, job, after, epoch, options_.hold, options_.io_timeout, &tag, &nodes);
    if (s.code() == Status::Code::kDeadlineExceeded) {  // it held the question: nothing newer yet
      if (options_.clock->Now() - asked >= options_.hold / 2) {
        grants_->PassOnGrants(job, nodes);
        return Status::OK();
      }
      s = Status::Unavailable(source + ": said nothing is newer without holding the question");
    }
    if (s.ok()) {
      grants_->PassOnGrants(job, nodes);
      s = cache_->AdoptFollowed(tag);
      if (s.ok()) {
        MutexLock lock(&mu_);
        Learned(&jobs_[job], tag);
        changed_.SignalAll();  // a following node's read may wait for this version
        return Status::OK();
      }
      s = Status::FromCode(s.code(), source + ": " + s.message());
    }
    why += (why.empty() ? "" : "; ") + s.message();
  }
  return Status::Unavailable(why.empty() ? "no source to ask" : why);
}

void VersionFollower::Watch(std::string job) {
  for (;;) {
    std::vector<std::string> sources;
    uint64_t after = 0, epoch = 0;
    {
      MutexLock lock(&mu_);
      if (stopping_) return;
      const Job& j = jobs_[job];
      sources = j.sources;
      after = j.newest;
      epoch = j.epoch;
    }
    Status s = Round(job, sources, after, epoch);
    MutexLock lock(&mu_);
    Job& j = jobs_[job];
    if (s.ok()) {
      j.failures = 0;
      j.last_error.clear();
      continue;
    }
    ++j.failures;
    j.last_error = s.message();
    const int doublings = static_cast<int>(std::min<uint64_t>(j.failures - 1, 20));
    const auto pause = std::min(options_.retry * (int64_t{1} << doublings), options_.retry_max);
    j.retry_at = options_.clock->Now() + pause;
    TCE_LOG(kWarning, "weights") << "following job=" << job << ": no source answered (" << j.failures
                                 << " round(s) in a row; the next in " << pause.count() << " ms): " << j.last_error;
    while (!stopping_ && options_.clock->Now() < j.retry_at)
      options_.clock->WaitUntil(&changed_, &mu_, j.retry_at);
  }
}

std::vector<FollowedJobInfo> VersionFollower::Jobs(bool admin, uid_t uid) {
  MutexLock lock(&mu_);
  const Clock::TimePoint now = options_.clock->Now();
  std::vector<FollowedJobInfo> out;
  for (const auto& [name, j] : jobs_) {
    if (!admin && !j.users.count(uid)) continue;
    FollowedJobInfo info;
    info.job = name;
    info.sources = j.sources;
    info.version = j.newest;
    info.failures = j.failures;
    info.last_error = j.last_error;
    if (j.failures && j.retry_at > now)
      info.retry_in = std::chrono::ceil<std::chrono::milliseconds>(j.retry_at - now);
    out.push_back(std::move(info));
  }
  return out;
}

}  // namespace tce
