#include "cache/buffer.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <string>

#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23
#endif

namespace tce {
namespace {

constexpr uint64_t kPage = 4096;
constexpr uint64_t kChunk = 64 << 10;

uint64_t RoundUp(uint64_t v, uint64_t to) { return (v + to - 1) / to * to; }

Status Allocate(int fd, uint64_t from, uint64_t to) {
  int rc;
  do {
    rc = fallocate(fd, 0, static_cast<off_t>(from), static_cast<off_t>(to - from));
  } while (rc != 0 && errno == EINTR);
  if (rc == 0) return Status::OK();
  const int err = errno;
  if (err == ENOSPC || err == ENOMEM)  // hugetlb: the reserved pages ran out
    return Status::ResourceExhausted("fallocate of a cache buffer: " + std::string(strerror(err)));
  return Status::FromErrno(err, "fallocate of a cache buffer");
}

// THP: pages are allocated through a mapping advised MADV_HUGEPAGE, so that
// shmem gives the file 2 MiB folios (fallocate alone allocates 4 KiB ones
// unless shmem_enabled is always).
Status PopulateHuge(int fd, uint64_t from, uint64_t to) {
  const uint64_t start = from / kHugePage * kHugePage;
  void* m = mmap(nullptr, to - start, PROT_READ | PROT_WRITE, MAP_SHARED, fd, static_cast<off_t>(start));
  if (m == MAP_FAILED) return Status::FromErrno(errno, "mmap to populate a cache buffer");
  madvise(m, to - start, MADV_HUGEPAGE);  // best effort: the pages are what matter
  Status s;
  if (madvise(m, to - start, MADV_POPULATE_WRITE) != 0)
    s = Status::FromErrno(errno, "populating a cache buffer");
  munmap(m, to - start);
  return s;
}

}  // namespace

uint64_t Buffer::CapacityFor(uint64_t size) {
  if (size < kChunk) return RoundUp(size, kPage);
  return RoundUp(size + std::min<uint64_t>(size / 64, 64 << 20), kChunk);
}

bool Buffer::Fits(uint64_t capacity, uint64_t size) {
  // (in whole huge pages: a hugetlb buffer's capacity is rounded up to one)
  return size <= capacity && capacity <= RoundUp(size + size / 8 + (1 << 20), kHugePage);
}

Buffer::~Buffer() {
  if (map_) munmap(map_, capacity_);
  // The pages go now, even where a client still holds an fd of this memfd
  // (an aborted allocation, a range buffer, kept past its session): they
  // would stay charged to the server, outside every budget. A mapping the
  // client kept reads zeros from here on.
  (void)!fallocate(fd_, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, 0, static_cast<off_t>(capacity_));
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
    const uint64_t page = backing_ == Backing::kHugetlb ? kHugePage : static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
    for (uint64_t off = 0; off < capacity_; off += page) sink = sink + map_[off];
  });
  *out = map_;
  return map_status_;
}

Status Buffer::Prefault(uint64_t capacity, Backing backing, int* out, const std::string& name) {
  if (backing == Backing::kHugetlb && capacity % kHugePage != 0)
    return Status::InvalidArgument("a hugetlb buffer's capacity must be a multiple of 2 MiB, not " +
                                   std::to_string(capacity));
  unsigned flags = MFD_CLOEXEC | MFD_ALLOW_SEALING;
  if (backing == Backing::kHugetlb) flags |= MFD_HUGETLB;
  int fd = memfd_create(name.c_str(), flags);
  if (fd < 0) return Status::FromErrno(errno, "memfd_create");
  Status s = Resize(fd, 0, capacity, backing);
  if (!s.ok()) {
    ::close(fd);
    return s;
  }
  *out = fd;
  return Status::OK();
}

Status Buffer::WriteAt(int fd, uint64_t offset, const void* data, size_t n, const char* what) {
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    ssize_t w = ::pwrite(fd, p, n, static_cast<off_t>(offset));
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return Status::FromErrno(w < 0 ? errno : EIO, std::string("write ") + what);
    p += w;
    offset += static_cast<uint64_t>(w);
    n -= static_cast<size_t>(w);
  }
  return Status::OK();
}

Status Buffer::Resize(int fd, uint64_t from, uint64_t to, Backing backing) {
  if (ftruncate(fd, static_cast<off_t>(to)) != 0) return Status::FromErrno(errno, "ftruncate of a cache buffer");
  if (to <= from) return Status::OK();
  Status s = backing == Backing::kThp ? PopulateHuge(fd, from, to) : Allocate(fd, from, to);
  if (!s.ok()) (void)!ftruncate(fd, static_cast<off_t>(from));  // back to its old size
  return s;
}

Status Buffer::Adopt(uint64_t id, int fd, uint64_t capacity, Backing backing,
                     std::unique_ptr<Buffer>* out) {
  if (fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) != 0) {
    Status s = Status::FromErrno(errno, "sealing a cache buffer");
    ::close(fd);
    return s;
  }
  // A memfd's inode is 0777: anyone holding a read-only fd could open it
  // again writable through /proc/self/fd. Readable by the server's uid
  // alone, a passed fd keeps the access it was given.
  if (fchmod(fd, S_IRUSR) != 0) {
    Status s = Status::FromErrno(errno, "restricting a cache buffer's mode");
    ::close(fd);
    return s;
  }
  out->reset(new Buffer(id, capacity, fd, backing));
  return Status::OK();
}

Status Buffer::Create(uint64_t id, uint64_t capacity, Backing backing, std::unique_ptr<Buffer>* out) {
  int fd;
  Status s = Prefault(capacity, backing, &fd, "tce:" + std::to_string(id));
  if (!s.ok()) return s;
  return Adopt(id, fd, capacity, backing, out);
}

Status Buffer::Create(uint64_t id, uint64_t capacity, std::unique_ptr<Buffer>* out) {
  return Create(id, capacity, Backing::k4k, out);
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
