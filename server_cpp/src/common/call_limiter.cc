#include "common/call_limiter.h"

#include <utility>

namespace tce {

CallLimiter::Slot& CallLimiter::Slot::operator=(Slot&& o) noexcept {
  if (this != &o) {
    Leave();
    limiter_ = o.limiter_;
    key_ = o.key_;
    o.limiter_ = nullptr;
  }
  return *this;
}

void CallLimiter::Slot::Leave() {
  if (limiter_ == nullptr) return;
  limiter_->Leave(key_);
  limiter_ = nullptr;
}

CallLimiter::CallLimiter(size_t total, size_t per_key, std::string setting, std::string per_key_setting,
                         std::string what)
    : total_(total),
      per_key_(per_key == 0 || per_key > total ? total : per_key),
      setting_(std::move(setting)),
      per_key_setting_(std::move(per_key_setting)),
      what_(std::move(what)) {}

Status CallLimiter::Enter(uint64_t key, Slot* slot) {
  MutexLock l(&mu_);
  if (running_ >= total_)
    return Status::ResourceExhausted("the server already runs " + std::to_string(running_) +
                                     " " + what_ + " (" + setting_ + "=" +
                                     std::to_string(total_) + "): try again later");
  auto it = by_key_.find(key);
  const size_t mine = it == by_key_.end() ? 0 : it->second;
  if (mine >= per_key_)
    return Status::ResourceExhausted("this user already runs " + std::to_string(mine) +
                                     " " + what_ + " (" + per_key_setting_ + "=" +
                                     std::to_string(per_key_) + "): try again later");
  ++by_key_[key];
  ++running_;
  slot->limiter_ = this;
  slot->key_ = key;
  return Status::OK();
}

void CallLimiter::Leave(uint64_t key) {
  MutexLock l(&mu_);
  auto it = by_key_.find(key);
  if (it == by_key_.end()) return;
  --running_;
  if (--it->second == 0) by_key_.erase(it);
}

size_t CallLimiter::running() const {
  MutexLock l(&mu_);
  return running_;
}

}  // namespace tce
