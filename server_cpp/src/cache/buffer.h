// Buffer: one memfd of fixed capacity, owned by the server.
// Created pre-faulted (fallocate: pages exist and are charged to the server's
// cgroup before any client touches them) and sealed against shrinking and
// growing, so a client can never make the server's view of it fault.
// Not thread-safe by itself; the Cache serialises access.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>

#include "common/status.h"

namespace tce {

class Buffer {
 public:
  ~Buffer();
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;

  // Creates, pre-faults and seals a memfd of `capacity` bytes.
  static Status Create(uint64_t id, uint64_t capacity, std::unique_ptr<Buffer>* out);

  uint64_t id() const { return id_; }
  uint64_t capacity() const { return capacity_; }
  int fd() const { return fd_; }

  // A new fd for the same memory: writable (dup) or read-only (reopened
  // through /proc/self/fd, our own process). The caller owns it.
  Status NewFd(bool writable, int* out) const;

  // The server's own shared mapping of the whole buffer, made (and faulted
  // in) on first use and kept for the buffer's lifetime, so background work
  // (backups) reads it without mapping or faulting again. Thread-safe.
  Status Mapping(const unsigned char** out);

 private:
  Buffer(uint64_t id, uint64_t capacity, int fd) : id_(id), capacity_(capacity), fd_(fd) {}
  std::once_flag mapped_;
  unsigned char* map_ = nullptr;
  Status map_status_;
  const uint64_t id_;
  const uint64_t capacity_;
  const int fd_;
};

}  // namespace tce
