// RangeBuffers: one scratch buffer per client session for ranged reads. A
// ReadRange with `into_buffer` writes the range into the session's buffer
// (the copy held here or a peer's bytes land there straight from the socket)
// and the client copies it out through a read-only fd (FdRequest with
// `range_buffer`), instead of receiving it inside the gRPC reply.
//
// Each buffer is kSize bytes (kSlots ranges of kMaxRangeLength), made on
// the session's first FdRequest for it and dropped when the session ends.
// Limits: at most kMax exist at once, at most `max_per_uid` for one uid
// (root included), so that one user cannot hold every one, and each one's
// kSize bytes are borrowed from the cache's memory budget (MemoryBudget)
// until its pages are freed. Beyond any of them the request gets
// RESOURCE_EXHAUSTED and that client reads through the reply. A session
// reaches only its own buffer, and what it finds there is only what it
// asked for: a client that writes into it through its fd can spoil only its
// own reads. Freeing a buffer punches its pages out (Buffer's destructor),
// so a client that keeps the fd keeps no memory. Thread-safe.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <map>
#include <memory>
#include <string>

#include "cache/buffer.h"
#include "cache/memory_budget.h"
#include "common/mutex.h"
#include "common/status.h"
#include "ring/range_read.h"
#include "rpc/uid_counts.h"

namespace tce {

class RangeBuffers {
 public:
  // One session's buffer and the server's writable mapping of it; its bytes
  // go back to the budget when it is freed.
  struct Held {
    ~Held();
    MemoryBudget* budget = nullptr;  // set once the bytes were borrowed
    std::unique_ptr<Buffer> buffer;
    unsigned char* map = nullptr;
  };

  static constexpr uint64_t kSlots = 4;
  static constexpr uint64_t kSize = kSlots * kMaxRangeLength;
  static constexpr size_t kMax = 8;

  // `budget` (the Cache) must outlive every buffer, including one a
  // ReadRange still holds after Drop.
  RangeBuffers(MemoryBudget* budget, size_t max_per_uid);

  // A read-only fd of the session's buffer (made now if it has none) and
  // its size. The caller owns the fd. `uid`: the session's, for the cap.
  Status Fd(const std::string& session, uid_t uid, int* fd, uint64_t* capacity) EXCLUDES(mu_);
  // Where to write bytes [offset, offset + length) of the session's buffer:
  // *at, valid while *hold lives. FAILED_PRECONDITION when the session has
  // no buffer; OUT_OF_RANGE when the bytes do not fit in it.
  Status Place(const std::string& session, uint64_t offset, uint64_t length,
               std::shared_ptr<Held>* hold, unsigned char** at) EXCLUDES(mu_);
  // The session ended: its buffer goes (once no ReadRange writes into it).
  void Drop(const std::string& session) EXCLUDES(mu_);

  size_t size() const EXCLUDES(mu_);

 private:
  struct Entry {
    std::shared_ptr<Held> held;
    uid_t uid;
  };
  // Makes a buffer: its bytes borrowed, its memfd made and mapped.
  Status Make(std::shared_ptr<Held>* out) REQUIRES(mu_);

  MemoryBudget* const budget_;
  mutable Mutex mu_;
  std::map<std::string, Entry> buffers_ GUARDED_BY(mu_);  // by session
  UidCounts per_uid_ GUARDED_BY(mu_);                     // buffers_ by uid
  uint64_t next_id_ GUARDED_BY(mu_) = 1;
};

}  // namespace tce
