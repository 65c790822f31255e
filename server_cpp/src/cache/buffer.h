// Buffer: one memfd of fixed capacity, owned by the server.
// Created pre-faulted (fallocate: pages exist and are charged to the server's
// cgroup before any client touches them) and sealed against shrinking and
// growing, so a client can never make the server's view of it fault. Backed
// by 4 KiB pages, hugetlb 2 MiB pages or shmem THP (cache/memory_backing.h);
// a hugetlb buffer's capacity is a multiple of 2 MiB.
// Not thread-safe by itself; the Cache serialises access. The static
// functions are thread-safe.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>

#include "cache/memory_backing.h"
#include "common/status.h"

namespace tce {

class Buffer {
 public:
  ~Buffer();
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;

  // Creates, pre-faults and seals a memfd of `capacity` bytes (4 KiB pages).
  static Status Create(uint64_t id, uint64_t capacity, std::unique_ptr<Buffer>* out);
  // The same with `backing`; a hugetlb capacity must be a multiple of
  // 2 MiB (INVALID_ARGUMENT), and no free huge page left is
  // RESOURCE_EXHAUSTED.
  static Status Create(uint64_t id, uint64_t capacity, Backing backing,
                       std::unique_ptr<Buffer>* out);
  // A new memfd of `capacity` bytes, zero-filled and pre-faulted, not sealed
  // (the pool keeps these until an allocation sizes and seals one). The
  // caller owns *fd. Its name shows in /proc/<pid>/maps and fd links as
  // /memfd:<name>: "tce:<buffer id>" for a buffer, "tce:pool" for a piece.
  static Status Prefault(uint64_t capacity, Backing backing, int* fd,
                         const std::string& name = "tce:pool");
  // Resizes an unsealed memfd of `from` bytes to `to`: shrinking frees the
  // tail, growing pre-faults the new (zero-filled) pages.
  static Status Resize(int fd, uint64_t from, uint64_t to, Backing backing);
  // Writes all `n` bytes of `data` at `offset` of memfd `fd` (pwrite: no
  // page faults of a mapping; hugetlbfs has no write(2), its buffers take
  // a mapping). `what` names the buffer in an error.
  static Status WriteAt(int fd, uint64_t offset, const void* data, size_t n, const char* what);
  // Seals a memfd of `capacity` bytes made by Prefault and wraps it; takes
  // ownership of `fd` (closed on error).
  static Status Adopt(uint64_t id, int fd, uint64_t capacity, Backing backing,
                      std::unique_ptr<Buffer>* out);

  // Capacity of a new buffer for a file of `size` bytes: a little headroom so
  // the next checkpoint of the same model (a few bytes longer) fits it.
  static uint64_t CapacityFor(uint64_t size);
  // Whether a free buffer of `capacity` may serve a file of `size` bytes.
  static bool Fits(uint64_t capacity, uint64_t size);

  uint64_t id() const { return id_; }
  uint64_t capacity() const { return capacity_; }
  Backing backing() const { return backing_; }
  int fd() const { return fd_; }

  // A new fd for the same memory: writable (dup) or read-only (reopened
  // through /proc/self/fd, our own process). The caller owns it.
  Status NewFd(bool writable, int* out) const;

  // The server's own shared mapping of the whole buffer, made (and faulted
  // in) on first use and kept for the buffer's lifetime, so background work
  // (backups) reads it without mapping or faulting again. Thread-safe.
  Status Mapping(const unsigned char** out);

 private:
  Buffer(uint64_t id, uint64_t capacity, int fd, Backing backing)
      : id_(id), capacity_(capacity), fd_(fd), backing_(backing) {}
  std::once_flag mapped_;
  unsigned char* map_ = nullptr;
  Status map_status_;
  const uint64_t id_;
  const uint64_t capacity_;
  const int fd_;
  const Backing backing_;
};

}  // namespace tce
