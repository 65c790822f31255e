#include "cache/buffer.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <string>

namespace tce {

Buffer::~Buffer() { ::close(fd_); }

Status Buffer::Create(uint64_t id, uint64_t capacity, std::unique_ptr<Buffer>* out) {
  std::string name = "tce:" + std::to_string(id);
  int fd = memfd_create(name.c_str(), MFD_CLOEXEC | MFD_ALLOW_SEALING);
  if (fd < 0) return Status::FromErrno(errno, "memfd_create");
  auto fail = [fd](const char* what) {
    int err = errno;
    ::close(fd);
    return Status::FromErrno(err, std::string(what) + " of a cache buffer");
  };
  if (ftruncate(fd, static_cast<off_t>(capacity)) != 0) return fail("ftruncate");
  int rc;
  do {
    rc = fallocate(fd, 0, 0, static_cast<off_t>(capacity));
  } while (rc != 0 && errno == EINTR);
  if (rc != 0) return fail("fallocate");
  if (fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) != 0)
    return fail("sealing");
  out->reset(new Buffer(id, capacity, fd));
  return Status::OK();
}

Status Buffer::NewFd(bool writable, int* out) const {
  int fd;
  if (writable) {
    fd = fcntl(fd_, F_DUPFD_CLOEXEC, 0);
  } else {
    std::string path = "/proc/self/fd/" + std::to_string(fd_);
    fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  }
  if (fd < 0) return Status::FromErrno(errno, writable ? "dup" : "reopen read-only");
  *out = fd;
  return Status::OK();
}

}  // namespace tce
