#include "cache/buffer.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <string>

namespace tce {

Buffer::~Buffer() {
  if (map_) munmap(map_, capacity_);
  ::close(fd_);
}

Status Buffer::Mapping(const unsigned char** out) {
  std::call_once(mapped_, [this] {
    void* m = mmap(nullptr, capacity_, PROT_READ, MAP_SHARED, fd_, 0);
    if (m == MAP_FAILED) {
      map_status_ = Status::FromErrno(errno, "mmap buffer " + std::to_string(id_));
      return;
    }
    map_ = static_cast<unsigned char*>(m);
    volatile unsigned char sink = 0;  // read-touch a byte per page: no faults later
    const long page = sysconf(_SC_PAGESIZE);
    for (uint64_t off = 0; off < capacity_; off += static_cast<uint64_t>(page)) sink = sink + map_[off];
  });
  *out = map_;
  return map_status_;
}

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
