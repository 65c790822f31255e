// CacheBuf: one of the Cache's memfd buffers and what holds it (its state,
// the sessions that map it, leases, persistence pins), and whose bytes it
// holds. Plain data, kept in the Cache's buffers_ under its lock.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <memory>
#include <set>
#include <string>

#include "cache/buffer.h"

namespace tce {

enum class CacheBufState { kFree, kPending, kCached, kDraining, kRetiring };

struct CacheBuf {
  std::unique_ptr<Buffer> mem;  // null once RETIRING
  uint64_t id = 0;
  uint64_t capacity = 0;
  CacheBufState state = CacheBufState::kFree;
  std::set<std::string> mappers;  // sessions holding a writable mapping
  // Sessions keeping a read-only mapping across leases (keep_mapped):
  // they never stop its reuse, and are told to unmap it when it goes.
  std::set<std::string> readers;
  int leases = 0;
  int pins = 0;                // persistence workers reading it
  // Never reused once free (destroyed instead): another uid got its fd
  // (a granted reader), or a version lease on it ended by expiry while
  // its reader may still map it.
  bool no_reuse = false;
  uint64_t allocation_id = 0;  // while PENDING
  uid_t uid = 0;               // whose bytes it holds: reused for this uid only
};

}  // namespace tce
