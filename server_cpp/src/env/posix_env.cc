#include <dirent.h>
#include <fcntl.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <cctype>
#include <vector>

#include "env/env.h"

namespace tce {
namespace {

class PosixWritableFile : public WritableFile {
 public:
  PosixWritableFile(std::string path, int fd) : path_(std::move(path)), fd_(fd) {}
  ~PosixWritableFile() override {
    if (fd_ >= 0) ::close(fd_);
  }
  Status Append(const char* data, size_t n) override {
    while (n > 0) {
      ssize_t w = ::write(fd_, data, n);
      if (w < 0) {
        if (errno == EINTR) continue;
        return Status::FromErrno(errno, "write " + path_);
      }
      data += w;
      n -= static_cast<size_t>(w);
    }
    return Status::OK();
  }
  Status WriteAt(uint64_t offset, const char* data, size_t n) override {
    while (n > 0) {
      ssize_t w = ::pwrite(fd_, data, n, static_cast<off_t>(offset));
      if (w < 0) {
        if (errno == EINTR) continue;
        return Status::FromErrno(errno, "write " + path_);
      }
      data += w;
      offset += static_cast<uint64_t>(w);
      n -= static_cast<size_t>(w);
    }
    return Status::OK();
  }
  Status Truncate(uint64_t size) override {
    if (::ftruncate(fd_, static_cast<off_t>(size)) != 0)
      return Status::FromErrno(errno, "ftruncate " + path_);
    return Status::OK();
  }
  Status Preallocate(uint64_t size) override {
    if (size == 0 || ::fallocate(fd_, 0, 0, static_cast<off_t>(size)) == 0) return Status::OK();
    if (errno == EOPNOTSUPP || errno == ENOSYS)
      return Status::NotSupported("fallocate " + path_ + ": " + std::strerror(errno));
    return Status::FromErrno(errno, "fallocate " + path_);
  }
  Status StartWriteback(uint64_t offset, uint64_t n) override {
    if (::sync_file_range(fd_, static_cast<off_t>(offset), static_cast<off_t>(n),
                          SYNC_FILE_RANGE_WRITE) != 0 &&
        errno != ESPIPE && errno != EINVAL)  // not supported here: fdatasync does it all
      return Status::FromErrno(errno, "sync_file_range " + path_);
    return Status::OK();
  }
  Status Sync() override {
    if (::fdatasync(fd_) != 0) return Status::FromErrno(errno, "fdatasync " + path_);
    return Status::OK();
  }
  Status Close() override {
    int fd = fd_;
    fd_ = -1;
    if (::close(fd) != 0) return Status::FromErrno(errno, "close " + path_);
    return Status::OK();
  }

 private:
  const std::string path_;
  int fd_;
};

std::string RandomHex16() {
  unsigned char raw[8];
  size_t got = 0;
  while (got < sizeof(raw)) {
    ssize_t n = getrandom(raw + got, sizeof(raw) - got, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    got += static_cast<size_t>(n);
  }
  static const char kHex[] = "0123456789abcdef";
  std::string out;
  for (unsigned char c : raw) {
    out += kHex[c >> 4];
    out += kHex[c & 15];
  }
  return out;
}

bool IsTempName(const std::string& name, const std::string& prefix) {
  if (name.size() != prefix.size() + 16 || name.compare(0, prefix.size(), prefix) != 0) return false;
  for (size_t i = prefix.size(); i < name.size(); ++i)
    if (!std::isxdigit(static_cast<unsigned char>(name[i])) || std::isupper(static_cast<unsigned char>(name[i])))
      return false;
  return true;
}

void Fill(const struct stat& st, FileStat* out) {
  out->dev = st.st_dev;
  out->ino = st.st_ino;
  out->size = static_cast<uint64_t>(st.st_size);
  out->mtime_ns = static_cast<int64_t>(st.st_mtim.tv_sec) * 1000000000 + st.st_mtim.tv_nsec;
  out->mode = st.st_mode;
  out->uid = st.st_uid;
  out->gid = st.st_gid;
  out->nlink = st.st_nlink;
}

Status FstatInto(int fd, const std::string& what, FileStat* out) {
  struct stat st;
  if (::fstat(fd, &st) != 0) return Status::FromErrno(errno, "fstat " + what);
  Fill(st, out);
  return Status::OK();
}

// A temp file in a directory fd: unnamed (O_TMPFILE) or under `name_`.
class PosixTempFile final : public TempFile {
 public:
  PosixTempFile(int dirfd, std::string dir, int fd, std::string name, std::string prefix)
      : file_(dir + "/" + (name.empty() ? "(unnamed)" : name), fd), dirfd_(dirfd), dir_(std::move(dir)),
        fd_(fd), name_(std::move(name)), prefix_(std::move(prefix)) {}
  ~PosixTempFile() override {
    if (replaced_ >= 0) ::close(replaced_);  // the replaced file's blocks are freed now
    ::close(dirfd_);
  }
  Status Append(const char* data, size_t n) override { return file_.Append(data, n); }
  Status WriteAt(uint64_t offset, const char* data, size_t n) override { return file_.WriteAt(offset, data, n); }
  Status Truncate(uint64_t size) override { return file_.Truncate(size); }
  Status Preallocate(uint64_t size) override { return file_.Preallocate(size); }
  Status Sync() override { return file_.Sync(); }
  Status StartWriteback(uint64_t offset, uint64_t n) override { return file_.StartWriteback(offset, n); }
  Status Close() override { return file_.Close(); }
  Status SetMode(uint32_t mode) override {
    if (::fchmod(fd_, mode & 07777) != 0) return Status::FromErrno(errno, "fchmod " + dir_ + "/" + name_);
    return Status::OK();
  }
  Status Stat(FileStat* out) override { return FstatInto(fd_, dir_ + "/" + name_, out); }

  Status Publish(const std::string& name) override {
    if (name.empty() || name == "." || name == ".." || name.find('/') != std::string::npos)
      return Status::InvalidArgument("not a file name: " + name);
    if (name_.empty()) {  // unnamed: link it under a fresh temp name first
      const std::string proc = "/proc/self/fd/" + std::to_string(fd_);
      for (int tries = 0; name_.empty(); ++tries) {
        std::string candidate = prefix_ + RandomHex16();
        if (::linkat(AT_FDCWD, proc.c_str(), dirfd_, candidate.c_str(), AT_SYMLINK_FOLLOW) == 0) {
          name_ = candidate;
        } else if (errno != EEXIST || tries > 8) {
          return Status::FromErrno(errno, "link the new file into " + dir_);
        }
      }
    }
    // Holds what the rename replaces (a path reference: no I/O, no access
    // needed), so dropping its last link does not free its blocks inside the
    // rename (ext4: ~140 ms a GiB); they are freed when this is destroyed.
    if (replaced_ < 0) replaced_ = ::openat(dirfd_, name.c_str(), O_PATH | O_NOFOLLOW | O_CLOEXEC);
    if (::renameat(dirfd_, name_.c_str(), dirfd_, name.c_str()) != 0) {
      const int err = errno;
      Discard();
      return Status::FromErrno(err, "rename " + dir_ + "/" + name_ + " -> " + name);
    }
    name_.clear();  // it is the final file now: never discarded
    return Status::OK();
  }
  void Discard() override {
    if (!name_.empty()) ::unlinkat(dirfd_, name_.c_str(), 0);
    name_.clear();
  }

 private:
  PosixWritableFile file_;
  const int dirfd_;  // our own duplicate
  const std::string dir_;
  const int fd_;      // owned by file_
  std::string name_;  // empty: unnamed, or published
  const std::string prefix_;
  int replaced_ = -1;  // O_PATH: the file Publish replaced, until destroyed
};

class PosixDirectory final : public Directory {
 public:
  PosixDirectory(int fd, std::string path) : fd_(fd), path_(std::move(path)) {}
  ~PosixDirectory() override { ::close(fd_); }

  Status NewTempFile(const std::string& prefix, bool direct, std::unique_ptr<TempFile>* out) override {
    const int flags = O_WRONLY | O_CLOEXEC | (direct ? O_DIRECT : 0);
    std::string name;
    int fd = ::openat(fd_, ".", flags | O_TMPFILE, 0644);
    if (fd < 0 && direct && errno == EINVAL) {
      // EINVAL: no O_DIRECT here, or no O_TMPFILE; tell them apart.
      int probe = ::openat(fd_, ".", O_WRONLY | O_CLOEXEC | O_TMPFILE, 0644);
      if (probe >= 0) {
        ::close(probe);
        return Status::NotSupported("O_DIRECT is not supported in " + path_);
      }
    }
    if (fd < 0 && (errno == EOPNOTSUPP || errno == EISDIR || errno == EINVAL || errno == ENOENT)) {
      for (int tries = 0; fd < 0 && tries < 8; ++tries) {  // no unnamed files here: a fresh name
        name = prefix + RandomHex16();
        fd = ::openat(fd_, name.c_str(), flags | O_CREAT | O_EXCL | O_NOFOLLOW, 0644);
        if (fd < 0 && errno != EEXIST) break;
      }
      if (fd < 0 && direct && errno == EINVAL)
        return Status::NotSupported("O_DIRECT is not supported in " + path_);
    }
    if (fd < 0) return Status::FromErrno(errno, "create a file in " + path_);
    int dup = ::fcntl(fd_, F_DUPFD_CLOEXEC, 0);
    if (dup < 0) {
      const int err = errno;
      if (!name.empty()) ::unlinkat(fd_, name.c_str(), 0);
      ::close(fd);
      return Status::FromErrno(err, "dup directory " + path_);
    }
    out->reset(new PosixTempFile(dup, path_, fd, name, prefix));
    return Status::OK();
  }

  Status RemoveTemps(const std::string& prefix, int* removed) override {
    *removed = 0;
    std::vector<std::string> names;
    Status s = Names(&names);
    if (!s.ok()) return s;
    for (const std::string& name : names)
      if (IsTempName(name, prefix) && ::unlinkat(fd_, name.c_str(), 0) == 0) ++*removed;
    return Status::OK();
  }

  Status Sync() override {
    if (::fsync(fd_) != 0) return Status::FromErrno(errno, "fsync dir " + path_);
    return Status::OK();
  }
  Status Stat(FileStat* out) override { return FstatInto(fd_, path_, out); }
  Status StatParent(FileStat* out) override {
    struct stat st;
    if (::fstatat(fd_, "..", &st, AT_SYMLINK_NOFOLLOW) != 0) return Status::FromErrno(errno, "stat " + path_ + "/..");
    Fill(st, out);
    return Status::OK();
  }
  Status StatAt(const std::string& name, FileStat* out) override {
    if (name.empty() || name == "." || name == ".." || name.find('/') != std::string::npos)
      return Status::InvalidArgument("not a file name: " + name);
    struct stat st;
    if (::fstatat(fd_, name.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0) {
      if (errno == ENOENT) return Status::NotFound(path_ + "/" + name + " does not exist");
      return Status::FromErrno(errno, "stat " + path_ + "/" + name);
    }
    Fill(st, out);
    return Status::OK();
  }
  Status ReadAt(const std::string& name, uint64_t offset, uint64_t n, char* into) override {
    return Read(name, [&](int fd, const std::string& what) {
      Status s;
      for (uint64_t done = 0; s.ok() && done < n;) {
        const size_t got = PreadSome(fd, what, into + done, n - done, offset + done, offset + n, &s);
        done += got;
      }
      return s;
    });
  }
  Status ReadPieces(const std::string& name, uint64_t offset, uint64_t n, size_t piece, const Sink& sink) override {
    if (piece == 0) return Status::InvalidArgument("a read in pieces of 0 bytes");
    return Read(name, [&](int fd, const std::string& what) {
      const size_t size = static_cast<size_t>(std::min<uint64_t>(piece, n));
      std::unique_ptr<char[]> buf(size > 0 ? new char[size] : nullptr);
      Status s;
      for (uint64_t done = 0; s.ok() && done < n;) {
        const size_t want = static_cast<size_t>(std::min<uint64_t>(size, n - done));
        size_t have = 0;
        while (s.ok() && have < want) have += PreadSome(fd, what, buf.get() + have, want - have, offset + done + have, offset + n, &s);
        if (s.ok()) s = sink(offset + done, buf.get(), have);
        done += have;
      }
      return s;
    });
  }
  Status List(std::vector<std::pair<std::string, FileStat>>* out) override {
    out->clear();
    std::vector<std::string> names;
    Status s = Names(&names);
    if (!s.ok()) return s;
    for (const std::string& name : names) {
      struct stat st;
      if (::fstatat(fd_, name.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0) continue;  // gone meanwhile
      FileStat fs;
      Fill(st, &fs);
      out->emplace_back(name, fs);
    }
    return Status::OK();
  }
  Status Remove(const std::string& name) override {
    if (!IsName(name)) return Status::InvalidArgument("not a file name: " + name);
    if (::unlinkat(fd_, name.c_str(), 0) != 0) {
      if (errno == ENOENT) return Status::NotFound(path_ + "/" + name + " does not exist");
      return Status::FromErrno(errno, "remove " + path_ + "/" + name);
    }
    return Status::OK();
  }

 private:
  // Opens the regular file `name` (no symlink) and runs `read` on it.
  Status Read(const std::string& name, const std::function<Status(int fd, const std::string& what)>& read) {
    if (!IsName(name)) return Status::InvalidArgument("not a file name: " + name);
    const std::string what = path_ + "/" + name;
    int fd = ::openat(fd_, name.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
    if (fd < 0) {
      if (errno == ENOENT) return Status::NotFound(what + " does not exist");
      if (errno == ELOOP) return Status::PermissionDenied(what + " is a symlink");
      return Status::FromErrno(errno, "open " + what);
    }
    struct stat st;
    Status s;
    if (::fstat(fd, &st) != 0) s = Status::FromErrno(errno, "fstat " + what);
    else if (!S_ISREG(st.st_mode)) s = Status::PermissionDenied(what + " is not a regular file");
    if (s.ok()) s = read(fd, what);
    ::close(fd);
    return s;
  }
  // One pread of up to `n` bytes at `at`: the bytes read (0 and *s set on an
  // error, or OUT_OF_RANGE when the file ends before `end`, the read's end).
  static size_t PreadSome(int fd, const std::string& what, char* into, uint64_t n, uint64_t at, uint64_t end,
                          Status* s) {
    for (;;) {
      ssize_t r = ::pread(fd, into, n, static_cast<off_t>(at));
      if (r < 0 && errno == EINTR) continue;
      if (r < 0) *s = Status::FromErrno(errno, "read " + what);
      else if (r == 0) *s = Status::FromCode(Status::Code::kOutOfRange, what + " ends before byte " + std::to_string(end));
      return r > 0 ? static_cast<size_t>(r) : 0;
    }
  }
  // The names in this directory, but "." and "..".
  Status Names(std::vector<std::string>* out) {
    int dup = ::openat(fd_, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dup < 0) return Status::FromErrno(errno, "open " + path_);
    DIR* d = ::fdopendir(dup);
    if (!d) {
      ::close(dup);
      return Status::FromErrno(errno, "opendir " + path_);
    }
    while (struct dirent* e = ::readdir(d))
      if (std::strcmp(e->d_name, ".") != 0 && std::strcmp(e->d_name, "..") != 0) out->push_back(e->d_name);
    ::closedir(d);
    return Status::OK();
  }
  static bool IsName(const std::string& name) {
    return !name.empty() && name != "." && name != ".." && name.find('/') == std::string::npos;
  }

  const int fd_;
  const std::string path_;
};

class PosixEnv final : public Env {
 public:
  Status CreateDirs(const std::string& dir) override {
    if (dir.empty() || dir == "/") return Status::OK();
    struct stat st;
    if (::stat(dir.c_str(), &st) == 0) {
      if (S_ISDIR(st.st_mode)) return Status::OK();
      return Status::FailedPrecondition(dir + " exists and is not a directory");
    }
    size_t slash = dir.rfind('/');
    if (slash != std::string::npos && slash > 0) {
      Status s = CreateDirs(dir.substr(0, slash));
      if (!s.ok()) return s;
    }
    if (::mkdir(dir.c_str(), 0755) != 0 && errno != EEXIST)
      return Status::FromErrno(errno, "mkdir " + dir);
    return Status::OK();
  }
  Status OpenDirectory(const std::string& root, const std::string& dir, bool create,
                       std::unique_ptr<Directory>* out) override {
    const bool under = dir == root || root == "/" ||
                       (dir.size() > root.size() && dir.compare(0, root.size(), root) == 0 && dir[root.size()] == '/');
    if (root.empty() || root[0] != '/' || !under)
      return Status::InvalidArgument(dir + " is not under the storage root " + root);
    int fd = ::open(root.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0) return Status::FromErrno(errno, "open storage root " + root);
    std::string at = root == "/" ? "" : root;
    size_t pos = root == "/" ? 0 : root.size();
    while (pos < dir.size()) {
      size_t end = dir.find('/', pos + 1);
      if (end == std::string::npos) end = dir.size();
      const std::string name = dir.substr(pos + 1, end - pos - 1);
      pos = end;
      if (name.empty()) continue;
      at += "/" + name;
      if (name == "." || name == "..") {
        ::close(fd);
        return Status::InvalidArgument(dir + " is not a normalised path");
      }
      int next = ::openat(fd, name.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
      if (next < 0 && errno == ENOENT && create) {
        if (::mkdirat(fd, name.c_str(), 0755) != 0 && errno != EEXIST) {
          const int err = errno;
          ::close(fd);
          return Status::FromErrno(err, "mkdir " + at);
        }
        next = ::openat(fd, name.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
      }
      const int err = errno;
      ::close(fd);
      if (next < 0 && (err == ELOOP || err == ENOTDIR))
        return Status::PermissionDenied(at + " is a symlink or not a directory: nothing is written through it");
      if (next < 0 && err == ENOENT) return Status::NotFound(at + " does not exist");
      if (next < 0) return Status::FromErrno(err, "open " + at);
      fd = next;
    }
    out->reset(new PosixDirectory(fd, dir));
    return Status::OK();
  }
  Status Stat(const std::string& path, FileStat* out) override {
    struct stat st;
    if (::lstat(path.c_str(), &st) != 0) {
      if (errno == ENOENT || errno == ENOTDIR) return Status::NotFound(path + " does not exist");
      return Status::FromErrno(errno, "stat " + path);
    }
    Fill(st, out);
    return Status::OK();
  }
  Status ResolvePath(const std::string& path, std::string* out) override {
    std::string prefix = path, rest;
    while (true) {
      char buf[PATH_MAX];
      if (::realpath(prefix.empty() ? "/" : prefix.c_str(), buf)) {
        std::string base = buf;
        *out = rest.empty() ? base : (base == "/" ? "" : base) + rest;
        return Status::OK();
      }
      if (errno != ENOENT && errno != ENOTDIR) return Status::FromErrno(errno, "realpath " + prefix);
      size_t slash = prefix.rfind('/');
      if (slash == std::string::npos) return Status::InvalidArgument("cannot resolve " + path);
      rest = prefix.substr(slash) + rest;
      prefix = prefix.substr(0, slash);
    }
  }
};

}  // namespace

Env* Env::Default() {
  static PosixEnv env;
  return &env;
}

}  // namespace tce
