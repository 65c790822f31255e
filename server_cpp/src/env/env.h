// Env: every filesystem call the server makes, behind one interface, so
// persistence can be tested against a fault-injecting Env (fail the Nth write
// with ENOSPC or EIO, fail a rename as a crash would). Files are only ever
// written through a Directory opened beneath a storage root. Implementations
// must be thread-safe.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "common/status.h"

namespace tce {

// What stat(2) says of a file or directory: enough to tell whether a name
// still refers to the same file, and the bits a replacement keeps.
struct FileStat {
  uint64_t dev = 0, ino = 0, size = 0;
  int64_t mtime_ns = 0;
  uint32_t mode = 0;  // st_mode (type and permission bits)
  uint32_t uid = 0, gid = 0;
  uint64_t nlink = 0;  // 0 for a directory that was removed while open
  std::string etag;    // object storage: the object's ETag (all else 0 but size)
};

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
  // Reserves [0, size) on disk and makes it the file's size (fallocate), so
  // that positional writes inside it allocate nothing and, direct ones, run
  // side by side (ext4 serializes direct writes that extend a file under
  // its inode lock). NOT_SUPPORTED where the filesystem has no fallocate.
  virtual Status Preallocate(uint64_t size) = 0;
  virtual Status Sync() = 0;  // fdatasync
  // Starts writing back [offset, offset + n) without waiting, so disk I/O
  // overlaps whatever comes next; Sync() still makes it durable.
  virtual Status StartWriteback(uint64_t offset, uint64_t n) = 0;
  virtual Status Close() = 0;
};

// A file being written under no final name yet. Publish gives it its name
// in the directory it was made in, atomically replacing what was there;
// until then a crash leaves no file at the final name (and, where the
// filesystem offers unnamed files, no file at all).
class TempFile : public WritableFile {
 public:
  // Permission bits (fchmod), before Publish.
  virtual Status SetMode(uint32_t mode) = 0;
  // fstat of the file (after Publish: the file now at its name).
  virtual Status Stat(FileStat* out) = 0;
  // Call after Sync, before Close. A file the name held stays referenced
  // (not open for I/O) until this TempFile is destroyed: freeing a large
  // file's blocks is slow, and the writer decides where that time is spent.
  virtual Status Publish(const std::string& name) = 0;
  // Removes the temp file's name, if it has one (after a failure).
  virtual void Discard() = 0;
};

// A directory opened beneath a storage root. Names it takes are single
// components; nothing it does follows a symlink, so swapping any directory
// below the root for a symlink can never redirect a write outside it.
class Directory {
 public:
  virtual ~Directory() = default;
  // A new file, mode 0644, with no name where the filesystem allows that
  // (O_TMPFILE), else named `temp_prefix` + 16 random hex digits and created
  // with O_EXCL|O_NOFOLLOW. With `direct`, O_DIRECT (NotSupported where the
  // filesystem refuses it).
  virtual Status NewTempFile(const std::string& temp_prefix, bool direct,
                             std::unique_ptr<TempFile>* out) = 0;
  // Removes the files in this directory whose names `temp_prefix` + 16 hex
  // digits could have made (a crashed server's temp files); counts them.
  virtual Status RemoveTemps(const std::string& temp_prefix, int* removed) = 0;
  virtual Status Sync() = 0;  // fsync, so a rename in it is durable
  // fstat of the directory itself, and of its parent (one lookup of ".."
  // from the open directory, no path walk).
  virtual Status Stat(FileStat* out) = 0;
  virtual Status StatParent(FileStat* out) = 0;
  // lstat of the entry `name` (a single component; a symlink is not
  // followed); NOT_FOUND when there is none.
  virtual Status StatAt(const std::string& name, FileStat* out) = 0;
  // Reads [offset, offset + n) of the regular file `name` into `into`
  // (opened with O_NOFOLLOW); NOT_FOUND when there is none, OUT_OF_RANGE
  // when it ends before offset + n, PERMISSION_DENIED for a symlink or
  // anything but a regular file.
  virtual Status ReadAt(const std::string& name, uint64_t offset, uint64_t n, char* into) = 0;
  // The same read, through one open of the file, handed to `sink` in pieces
  // of at most `piece` bytes, in order (each with its offset in the file):
  // for a reader that writes the bytes on (a cache buffer's memfd) rather
  // than into memory of its own. A sink's error ends the read.
  using Sink = std::function<Status(uint64_t offset, const char* data, size_t n)>;
  virtual Status ReadPieces(const std::string& name, uint64_t offset, uint64_t n, size_t piece,
                            const Sink& sink) = 0;
  // The entries of this directory (not "." or ".."), each with its lstat.
  virtual Status List(std::vector<std::pair<std::string, FileStat>>* out) = 0;
  // Removes the file (or symlink) `name`; NOT_FOUND when there is none.
  virtual Status Remove(const std::string& name) = 0;
};

class Env {
 public:
  virtual ~Env() = default;
  // The process-wide POSIX Env.
  static Env* Default();

  // mkdir -p, mode 0755.
  virtual Status CreateDirs(const std::string& dir) = 0;
  // lstat of `path`; NOT_FOUND when nothing is there.
  virtual Status Stat(const std::string& path, FileStat* out) = 0;
  // realpath() of the longest existing prefix of `path`, with the rest appended.
  virtual Status ResolvePath(const std::string& path, std::string* out) = 0;
  // Opens the directory `dir` (absolute, normalised, no symlinks expected)
  // beneath `root` (absolute, trusted): from the root, each component is
  // opened with O_NOFOLLOW, and created (mode 0755) where missing if
  // `create`. A symlink or a non-directory on the way is PERMISSION_DENIED;
  // `dir` not under `root`, INVALID_ARGUMENT.
  virtual Status OpenDirectory(const std::string& root, const std::string& dir, bool create,
                               std::unique_ptr<Directory>* out) = 0;
};

}  // namespace tce
