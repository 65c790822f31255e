#include "ring/range_read.h"

#include <unistd.h>

#include <cerrno>

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
  uint64_t done = 0;
  while (done < length) {
    const ssize_t n = pread(fd, &(*out)[done], length - done, static_cast<off_t>(offset + done));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return Status::FromErrno(errno, "pread");
    if (n == 0) return Status::DataLoss("the buffer ended at " + std::to_string(offset + done));
    done += static_cast<uint64_t>(n);
  }
  return Status::OK();
}

}  // namespace tce
