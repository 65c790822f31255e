// Env: every filesystem call the server makes, behind one interface, so
// persistence can be tested against a fault-injecting Env (fail the Nth write
// with ENOSPC or EIO, fail a rename as a crash would). Implementations must be
// thread-safe.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "common/status.h"

namespace tce {

class WritableFile {
 public:
  virtual ~WritableFile() = default;
  // Direct files (O_DIRECT) need `data` page-aligned and `n` a multiple of
  // 4096; the caller truncates the padding away at the end.
  virtual Status Append(const char* data, size_t n) = 0;
  // Writes at `offset` (pwrite); safe to call from several threads at once
  // for disjoint ranges (the same alignment rules as Append for direct files).
  virtual Status WriteAt(uint64_t offset, const char* data, size_t n) = 0;
  virtual Status Truncate(uint64_t size) = 0;
  virtual Status Sync() = 0;  // fdatasync
  // Starts writing back [offset, offset + n) without waiting, so disk I/O
  // overlaps whatever comes next; Sync() still makes it durable.
  virtual Status StartWriteback(uint64_t offset, uint64_t n) = 0;
  virtual Status Close() = 0;
};

class Env {
 public:
  virtual ~Env() = default;
  // The process-wide POSIX Env.
  static Env* Default();

  // Creates (or truncates) `path`, mode 0644. With `direct`, writes bypass the
  // page cache (O_DIRECT); NotSupported where the filesystem refuses that.
  virtual Status NewWritableFile(const std::string& path, bool direct,
                                 std::unique_ptr<WritableFile>* out) = 0;
  virtual Status RenameFile(const std::string& from, const std::string& to) = 0;
  virtual Status RemoveFile(const std::string& path) = 0;
  // mkdir -p, mode 0755.
  virtual Status CreateDirs(const std::string& dir) = 0;
  // fsync of a directory, so a rename in it is durable.
  virtual Status SyncDir(const std::string& dir) = 0;
  // realpath() of the longest existing prefix of `path`, with the rest appended.
  virtual Status ResolvePath(const std::string& path, std::string* out) = 0;
};

}  // namespace tce
