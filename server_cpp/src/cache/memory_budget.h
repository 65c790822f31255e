// MemoryBudget: room in the cache's memory budget for memory that is not a
// cache buffer but is held for clients all the same (the fd socket's range
// buffers, rpc/range_buffers.h), so that one limit bounds everything the
// server holds for them. The Cache is one. Any thread.
#pragma once

#include <cstdint>

namespace tce {

class MemoryBudget {
 public:
  virtual ~MemoryBudget() = default;
  // Counts `bytes` against the budget if they fit beside what it holds now,
  // after destroying free buffers nobody maps (never a file, nor a buffer a
  // session maps: what borrows is a convenience, and reading without it
  // works); false, with nothing counted, when they do not fit.
  virtual bool Borrow(uint64_t bytes) = 0;
  // `bytes` borrowed earlier were freed.
  virtual void GiveBack(uint64_t bytes) = 0;
};

}  // namespace tce
