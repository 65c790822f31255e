#include "common/progress_board.h"

#include <chrono>
#include <utility>

namespace tce {

ProgressBoard::Entry& ProgressBoard::Entry::operator=(Entry&& o) noexcept {
  if (this != &o) {
    End();
    board_ = o.board_;
    id_ = o.id_;
    o.board_ = nullptr;
  }
  return *this;
}

void ProgressBoard::Entry::SetTotal(uint64_t files, uint64_t bytes) {
  if (board_) board_->Update(id_, files, bytes, 0, /*total=*/true);
}

void ProgressBoard::Entry::AddDone(uint64_t files, uint64_t bytes, uint64_t failed) {
  if (board_) board_->Update(id_, files, bytes, failed, /*total=*/false);
}

void ProgressBoard::Entry::End() {
  if (board_) board_->Remove(id_);
  board_ = nullptr;
}

ProgressBoard::Entry ProgressBoard::Begin(const std::string& kind, const std::string& job, const std::string& tag,
                                          const std::string& from, uid_t uid) {
  Op op;
  op.p.kind = kind;
  op.p.job = job;
  op.p.tag = tag;
  op.p.from = from;
  op.p.uid = uid;
  op.p.started_unix_ms = clock_->UnixNowNs() / 1000000;
  op.since = clock_->Now();
  MutexLock l(&mu_);
  const uint64_t id = next_id_++;
  ops_.emplace(id, std::move(op));
  return Entry(this, id);
}

std::vector<OperationProgress> ProgressBoard::Running(bool all, uid_t uid) const {
  const Clock::TimePoint now = clock_->Now();
  MutexLock l(&mu_);
  std::vector<OperationProgress> out;
  for (const auto& [id, op] : ops_) {
    if (!all && op.p.uid != uid) continue;
    out.push_back(op.p);
    out.back().elapsed_s = std::chrono::duration<double>(now - op.since).count();
  }
  return out;
}

void ProgressBoard::Update(uint64_t id, uint64_t files, uint64_t bytes, uint64_t failed, bool total) {
  MutexLock l(&mu_);
  auto it = ops_.find(id);
  if (it == ops_.end()) return;
  OperationProgress& p = it->second.p;
  if (total) {
    p.files_total = files;
    p.bytes_total = bytes;
  } else {
    p.files_done += files;
    p.bytes_done += bytes;
    p.files_failed += failed;
  }
}

void ProgressBoard::Remove(uint64_t id) {
  MutexLock l(&mu_);
  ops_.erase(id);
}

}  // namespace tce
