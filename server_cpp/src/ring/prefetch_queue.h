// PrefetchQueue: the prefetches of a cooperative restore waiting to run
// (ring/replicator.h, docs/ring.md), fair between the uids that own their
// jobs. Each uid may have at most kPerUid prefetches queued or running
// (kMax in all); the workers serve the uids in turn, one step of one
// prefetch at a time (a listing, or one file read from storage), and never
// run two steps of one uid at once. So however many or large one uid's
// prefetches are, another uid's next step waits for at most one step per
// worker. Thread-safe: RPC threads Add, the prefetch workers Take and Done.
#pragma once

#include <sys/types.h>

#include <cstddef>
#include <deque>
#include <map>
#include <string>
#include <vector>

#include "common/mutex.h"
#include "common/progress_board.h"

namespace tce {

// One prefetch and how far it got (the worker's part).
struct PrefetchJob {
  std::string job, dir;
  std::vector<std::string> paths;  // or, empty, the files of `dir` on storage
  bool only_if_empty = false;      // only while the node holds none of the job's files
  bool started = false;            // `paths` is final (listed)
  size_t next = 0;                 // the next of `paths` to look at
  size_t mine = 0, read = 0, failed = 0;
  std::string first_error;
  std::vector<uint64_t> sizes;  // of this node's share, in order, where listed (0: unknown)
  ProgressBoard::Entry shown;   // on tce status while it runs (from its first step)
};

class PrefetchQueue {
 public:
  static constexpr size_t kMax = 64;     // queued or running, in all
  static constexpr size_t kPerUid = 8;  // queued or running, of one uid's jobs

  // Queues `p` for `uid`; false when that uid has kPerUid, or all have
  // kMax, the same prefetch (job, dir, paths) is queued or running, or the
  // queue is stopped.
  bool Add(uid_t uid, PrefetchJob p) EXCLUDES(mu_);
  // Blocks for the prefetch whose step comes next: the front one of the
  // uid whose turn it is (that uid then has no other step running until
  // Done; `p` must live until then). False once stopped.
  bool Take(uid_t* uid, PrefetchJob* p) EXCLUDES(mu_);
  // The step of `uid`'s prefetch `*p` (Take's) is done; unless `finished`,
  // it is moved back to the front of that uid's queue, and the uid to the
  // end of the turns.
  void Done(uid_t uid, PrefetchJob* p, bool finished) EXCLUDES(mu_);
  // Take returns false from now on, Add refuses.
  void Stop() EXCLUDES(mu_);
  bool stopped() EXCLUDES(mu_);

 private:
  static bool Same(const PrefetchJob& a, const PrefetchJob& b);

  Mutex mu_;
  CondVar cv_;
  bool stop_ GUARDED_BY(mu_) = false;
  std::map<uid_t, std::deque<PrefetchJob>> queued_ GUARDED_BY(mu_);
  std::map<uid_t, const PrefetchJob*> running_ GUARDED_BY(mu_);  // the step under way, by uid (the worker's)
  std::deque<uid_t> turns_ GUARDED_BY(mu_);  // uids with a queued prefetch and no step running
  size_t count_ GUARDED_BY(mu_) = 0;  // queued and running
};

}  // namespace tce
