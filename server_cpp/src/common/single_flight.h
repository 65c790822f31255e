// SingleFlight: one run of a piece of work per key at a time. A caller that
// finds the key's work under way waits for it and gets its outcome instead
// of doing it again (a file read from storage once however many loads ask).
// Thread-safe.
#pragma once

#include <functional>
#include <map>
#include <memory>

#include "common/clock.h"
#include "common/mutex.h"
#include "common/status.h"

namespace tce {

template <class Key>
class SingleFlight {
 public:
  // Runs `work` for `key`, unless it runs already: then waits for that run
  // and returns its outcome (*shared: true); `joined` (optional) is called
  // as such a caller begins to wait. With `clock`, that wait ends at
  // `deadline` (the caller's), with DEADLINE_EXCEEDED; the run goes on.
  Status Do(const Key& key, const std::function<Status()>& work, bool* shared,
            const std::function<void()>& joined = nullptr, Clock* clock = nullptr,
            Clock::TimePoint deadline = Clock::TimePoint::max()) {
    std::shared_ptr<Flight> mine;
    {
      MutexLock l(&mu_);
      auto it = flights_.find(key);
      if (it != flights_.end()) {
        std::shared_ptr<Flight> theirs = it->second;
        if (joined) joined();
        *shared = true;
        while (!theirs->done) {
          if (!clock) {
            landed_.Wait(&mu_);
          } else if (!clock->WaitUntil(&landed_, &mu_, deadline) && !theirs->done) {
            return Status::DeadlineExceeded("the caller's deadline passed while another call did the same work");
          }
        }
        return theirs->result;
      }
      mine = std::make_shared<Flight>();
      flights_[key] = mine;
    }
    *shared = false;
    Status s = work();
    MutexLock l(&mu_);
    mine->done = true;
    mine->result = s;
    flights_.erase(key);
    landed_.SignalAll();
    return s;
  }

 private:
  struct Flight {
    bool done = false;  // under mu_
    Status result;
  };
  Mutex mu_;
  CondVar landed_;
  std::map<Key, std::shared_ptr<Flight>> flights_ GUARDED_BY(mu_);
};

}  // namespace tce
