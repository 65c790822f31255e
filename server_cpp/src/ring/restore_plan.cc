#include "ring/restore_plan.h"

#include <algorithm>
#include <numeric>

#include "common/logging.h"
#include "storage/identity.h"

namespace tce {
namespace {

constexpr size_t kMaxPlans = 1024;  // (job, directory) pairs kept; past it, all are made again

// FNV-1a: the same on every node (std::hash need not be).
uint64_t StableHash(const std::string& s) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : s) {
    h ^= c;
    h *= 1099511628211ull;
  }
  return h;
}

}  // namespace

std::vector<size_t> AssignByBytes(const std::vector<ListedObject>& files, size_t nodes) {
  std::vector<size_t> out(files.size(), 0);
  if (nodes == 0) return out;
  std::vector<size_t> order(files.size());
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    if (files[a].size != files[b].size) return files[a].size > files[b].size;
    return files[a].key < files[b].key;
  });
  std::vector<uint64_t> load(nodes, 0);
  for (size_t i : order) {
    const size_t least = static_cast<size_t>(std::min_element(load.begin(), load.end()) - load.begin());
    out[i] = least;
    load[least] += files[i].size;
  }
  return out;
}

RestorePlans::RestorePlans(Lister list, Clock* clock, std::chrono::milliseconds ttl,
                           std::chrono::milliseconds down_for)
    : list_(std::move(list)),
      clock_(clock),
      ttl_(ttl),
      down_for_(down_for),
      list_log_(5, std::chrono::seconds(10), clock) {}

std::vector<std::string> RestorePlans::LiveNodes(const std::string& job, const std::vector<std::string>& nodes) {
  std::vector<std::string> live;
  const Clock::TimePoint now = clock_->Now();
  for (const std::string& n : nodes) {
    auto d = down_.find({job, n});
    if (d != down_.end() && now - d->second >= down_for_) {
      down_.erase(d);
      d = down_.end();
    }
    if (d == down_.end()) live.push_back(n);
  }
  return live;
}

std::string RestorePlans::OwnerOf(const std::string& job, const std::vector<std::string>& nodes,
                                  const std::string& path) {
  const std::string dir = Dirname(path);
  std::vector<std::string> live;
  {
    MutexLock l(&mu_);
    live = LiveNodes(job, nodes);
    if (live.empty()) return "";
    auto it = plans_.find({job, dir});
    if (it != plans_.end() && it->second.nodes == live && clock_->Now() - it->second.made < ttl_) {
      auto o = it->second.owner.find(path);
      if (o != it->second.owner.end()) return live[o->second];
      return live[StableHash(path) % live.size()];
    }
  }
  // Listed without the lock (storage may be slow); two callers may both
  // list, and make the same plan.
  std::vector<ListedObject> files;
  Status s = list_(job, dir, &files);
  if (!s.ok()) {
    uint64_t dropped = 0;  // a job naming many missing directories logs a few lines
    if (list_log_.Allow(&dropped))
      TCE_LOG(kWarning, "ring") << "cannot list " << dir << " to plan the restore of job=" << job << ": "
                                << s.ToString() << "; its files are placed by name" << Suppressed(dropped);
    files.clear();
  }
  Plan plan;
  plan.nodes = live;
  plan.made = clock_->Now();
  const std::vector<size_t> owners = AssignByBytes(files, live.size());
  for (size_t i = 0; i < files.size(); ++i) plan.owner[files[i].key] = owners[i];
  auto o = plan.owner.find(path);
  const std::string owner = o != plan.owner.end() ? live[o->second] : live[StableHash(path) % live.size()];
  MutexLock l(&mu_);
  if (plans_.size() >= kMaxPlans) plans_.clear();
  plans_[{job, dir}] = std::move(plan);
  return owner;
}

void RestorePlans::MarkDown(const std::string& job, const std::string& node) {
  MutexLock l(&mu_);
  const Clock::TimePoint now = clock_->Now();
  auto [it, added] = down_.emplace(std::make_pair(job, node), now);
  const bool was_down = !added && now - it->second < down_for_;
  it->second = now;
  if (was_down) return;  // another load found it so a moment ago
  TCE_LOG(kWarning, "ring") << node << " did not answer for job=" << job << ": for "
                            << down_for_.count() / 1000 << " s its files are read by the other nodes, "
                            << "and loads ask it nothing";
}

bool RestorePlans::IsDown(const std::string& job, const std::string& node) {
  MutexLock l(&mu_);
  auto d = down_.find({job, node});
  return d != down_.end() && clock_->Now() - d->second < down_for_;
}

}  // namespace tce
