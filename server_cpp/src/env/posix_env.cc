#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <cstdlib>

#include "env/env.h"

namespace tce {
namespace {

class PosixWritableFile final : public WritableFile {
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

class PosixEnv final : public Env {
 public:
  Status NewWritableFile(const std::string& path, bool direct,
                         std::unique_ptr<WritableFile>* out) override {
    int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | (direct ? O_DIRECT : 0),
                    0644);
    if (fd < 0 && direct && errno == EINVAL)
      return Status::NotSupported("O_DIRECT is not supported for " + path);
    if (fd < 0) return Status::FromErrno(errno, "create " + path);
    out->reset(new PosixWritableFile(path, fd));
    return Status::OK();
  }
  Status RenameFile(const std::string& from, const std::string& to) override {
    if (::rename(from.c_str(), to.c_str()) != 0)
      return Status::FromErrno(errno, "rename " + from + " -> " + to);
    return Status::OK();
  }
  Status RemoveFile(const std::string& path) override {
    if (::unlink(path.c_str()) != 0 && errno != ENOENT)
      return Status::FromErrno(errno, "unlink " + path);
    return Status::OK();
  }
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
  Status SyncDir(const std::string& dir) override {
    int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0) return Status::FromErrno(errno, "open dir " + dir);
    int rc = ::fsync(fd);
    int err = errno;
    ::close(fd);
    if (rc != 0) return Status::FromErrno(err, "fsync dir " + dir);
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
