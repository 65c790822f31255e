#include "ring/range_read.h"

#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>

#include "persist/crc.h"

namespace tce {

Status CheckRange(uint64_t offset, uint64_t length, uint64_t size) {
  if (length == 0 || length > kMaxRangeLength)
    return Status::InvalidArgument("a ranged read takes 1 to " + std::to_string(kMaxRangeLength) +
                                   " bytes, not " + std::to_string(length));
  if (offset > size || length > size - offset)  // never offset + length: it may wrap
    return Status::FromCode(Status::Code::kOutOfRange,
                            "bytes [" + std::to_string(offset) + ", +" + std::to_string(length) +
                                ") are not inside the file's " + std::to_string(size) + " bytes");
  return Status::OK();
}

Status ReadRangeOf(int fd, uint64_t offset, uint64_t length, std::string* out) {
  out->resize(length);
  return ReadRangeOf(fd, offset, length, reinterpret_cast<unsigned char*>(&(*out)[0]));
}

Status ReadRangeOf(int fd, uint64_t offset, uint64_t length, unsigned char* to) {
  uint64_t done = 0;
  while (done < length) {
    const ssize_t n = pread(fd, to + done, length - done, static_cast<off_t>(offset + done));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return Status::FromErrno(errno, "pread");
    if (n == 0) return Status::DataLoss("the buffer ended at " + std::to_string(offset + done));
    done += static_cast<uint64_t>(n);
  }
  return Status::OK();
}

Status CrcOfRange(int fd, uint64_t offset, uint64_t length, uint32_t* crc) {
  // A mapping starts and ends on pages of the file's own size (2 MiB on
  // hugetlbfs, which reports it as the block size and refuses anything else).
  uint64_t page = static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
  struct stat st;
  if (fstat(fd, &st) == 0 && st.st_blksize > 0 && (st.st_blksize & (st.st_blksize - 1)) == 0)
    page = std::max(page, static_cast<uint64_t>(st.st_blksize));
  const uint64_t start = offset - offset % page;
  const uint64_t end = offset + length;
  const size_t span = static_cast<size_t>((end + page - 1) / page * page - start);
  void* map = mmap(nullptr, span, PROT_READ, MAP_SHARED | MAP_POPULATE, fd, static_cast<off_t>(start));
  if (map == MAP_FAILED) return Status::FromErrno(errno, "mmap");
  *crc = Crc32(0, static_cast<const unsigned char*>(map) + (offset - start), static_cast<size_t>(length));
  munmap(map, span);
  return Status::OK();
}

}  // namespace tce
