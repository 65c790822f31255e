// RangeBuffers: one scratch buffer per client session for ranged reads. A
// ReadRange with `into_buffer` writes the range into the session's buffer
// (the copy held here or a peer's bytes land there straight from the socket)
// and the client copies it out through a read-only fd (FdRequest with
// `range_buffer`), instead of receiving it inside the gRPC reply.
//
// Each buffer is kSize bytes (kSlots ranges of kMaxRangeLength), made on
// the session's first FdRequest for it and dropped when the session ends;
// at most kMax exist at once (RESOURCE_EXHAUSTED beyond: that client reads
// through the reply). Their memory is outside the cache's budget, bounded
// by kMax * kSize. A session reaches only its own buffer, and what it finds
// there is only what it asked for: a client that writes into it through
// its fd can spoil only its own reads. Thread-safe.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>

#include "cache/buffer.h"
#include "common/mutex.h"
#include "common/status.h"
#include "ring/range_read.h"

namespace tce {

class RangeBuffers {
 public:
  // One session's buffer and the server's writable mapping of it.
  struct Held {
    ~Held();
    std::unique_ptr<Buffer> buffer;
    unsigned char* map = nullptr;
  };

  static constexpr uint64_t kSlots = 4;
  static constexpr uint64_t kSize = kSlots * kMaxRangeLength;
  static constexpr size_t kMax = 8;

  // A read-only fd of the session's buffer (made now if it has none) and
  // its size. The caller owns the fd.
  Status Fd(const std::string& session, int* fd, uint64_t* capacity) EXCLUDES(mu_);
  // Where to write bytes [offset, offset + length) of the session's buffer:
  // *at, valid while *hold lives. FAILED_PRECONDITION when the session has
  // no buffer; OUT_OF_RANGE when the bytes do not fit in it.
  Status Place(const std::string& session, uint64_t offset, uint64_t length,
               std::shared_ptr<Held>* hold, unsigned char** at) EXCLUDES(mu_);
  // The session ended: its buffer goes (once no ReadRange writes into it).
  void Drop(const std::string& session) EXCLUDES(mu_);

  size_t size() const EXCLUDES(mu_);

 private:
  mutable Mutex mu_;
  std::map<std::string, std::shared_ptr<Held>> buffers_ GUARDED_BY(mu_);
  uint64_t next_id_ GUARDED_BY(mu_) = 1;
};

}  // namespace tce
