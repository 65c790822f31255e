#include "rpc/uid_counts.h"

namespace tce {

Status UidCounts::Take(uid_t uid) {
  if (held(uid) >= max_)
    return Status::ResourceExhausted("uid " + std::to_string(uid) + " holds " + std::to_string(max_) +
                                     " " + what_ + " (" + setting_ + ")");
  ++held_[uid];
  return Status::OK();
}

void UidCounts::Give(uid_t uid) {
  auto it = held_.find(uid);
  if (it == held_.end()) return;
  if (--it->second == 0) held_.erase(it);
}

size_t UidCounts::held(uid_t uid) const {
  auto it = held_.find(uid);
  return it == held_.end() ? 0 : it->second;
}

}  // namespace tce
