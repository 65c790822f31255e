// ProgressBoard: the long operations running on this server (a prefetch of
// this node's share of a checkpoint, the ring's restore of this node's
// files from its successor), each with how far it got, so `tce status` and
// the metrics show what the server is reading and how fast
// (docs/operations.md). An operation is on the board from Begin until its
// Entry ends or goes; a finished one leaves no trace. Its one worker
// thread moves its Entry; RPC threads read Running. Thread-safe (its own
// mutex, a leaf: nothing is called while it is held).
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "common/clock.h"
#include "common/mutex.h"

namespace tce {

struct OperationProgress {
  std::string kind;  // ProgressBoard::kPrefetch, kRingRestore
  std::string job;
  std::string tag;   // the checkpoint's directory name, when one is known
  std::string from;  // where the bytes come from: a peer's endpoint ("": storage)
  uid_t uid = 0;     // the uid the job belongs to here
  uint64_t files_done = 0, files_total = 0;  // done: read, or given up on (files_failed)
  uint64_t files_failed = 0;
  uint64_t bytes_done = 0, bytes_total = 0;  // bytes_total 0: the sizes are not known
  int64_t started_unix_ms = 0;
  double elapsed_s = 0;
};

class ProgressBoard {
 public:
  static constexpr const char* kPrefetch = "prefetch";
  static constexpr const char* kRingRestore = "ring restore";

  // Shows one operation while it lives (move-only). A default one shows
  // nothing and ignores every call.
  class Entry {
   public:
    Entry() = default;
    Entry(Entry&& o) noexcept : board_(o.board_), id_(o.id_) { o.board_ = nullptr; }
    Entry& operator=(Entry&& o) noexcept;
    Entry(const Entry&) = delete;
    Entry& operator=(const Entry&) = delete;
    ~Entry() { End(); }

    void SetTotal(uint64_t files, uint64_t bytes);
    // `files` more done (of which `failed` given up on), `bytes` of them.
    void AddDone(uint64_t files, uint64_t bytes, uint64_t failed = 0);
    // Off the board now.
    void End();
    bool active() const { return board_ != nullptr; }

   private:
    friend class ProgressBoard;
    Entry(ProgressBoard* board, uint64_t id) : board_(board), id_(id) {}
    ProgressBoard* board_ = nullptr;
    uint64_t id_ = 0;
  };

  // Elapsed times are measured on `clock` (outlives the board).
  explicit ProgressBoard(Clock* clock = Clock::Real()) : clock_(clock) {}
  ProgressBoard(const ProgressBoard&) = delete;
  ProgressBoard& operator=(const ProgressBoard&) = delete;

  Entry Begin(const std::string& kind, const std::string& job, const std::string& tag, const std::string& from,
              uid_t uid) EXCLUDES(mu_);
  // The operations running now, the oldest first: every one for an
  // administrator (`all`), else those of `uid`'s jobs.
  std::vector<OperationProgress> Running(bool all, uid_t uid) const EXCLUDES(mu_);

 private:
  struct Op {
    OperationProgress p;
    Clock::TimePoint since;
  };
  void Update(uint64_t id, uint64_t files, uint64_t bytes, uint64_t failed, bool total) EXCLUDES(mu_);
  void Remove(uint64_t id) EXCLUDES(mu_);

  Clock* const clock_;
  mutable Mutex mu_;
  std::map<uint64_t, Op> ops_ GUARDED_BY(mu_);  // by id: the order they began
  uint64_t next_id_ GUARDED_BY(mu_) = 1;
};

}  // namespace tce
