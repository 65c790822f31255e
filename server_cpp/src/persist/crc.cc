#include "persist/crc.h"

#include <zlib.h>

#include <cstring>

namespace tce {
namespace {
void Put32(unsigned char* p, uint32_t v) {
  for (int i = 0; i < 4; ++i) p[i] = static_cast<unsigned char>(v >> (8 * i));
}
}  // namespace

uint32_t Crc32(const unsigned char* data, size_t n) {
  uLong crc = crc32(0L, Z_NULL, 0);
  while (n > 0) {
    uInt chunk = n > (1u << 30) ? (1u << 30) : static_cast<uInt>(n);
    crc = crc32(crc, data, chunk);
    data += chunk;
    n -= chunk;
  }
  return static_cast<uint32_t>(crc);
}

Status FillZipCrcs(unsigned char* file, uint64_t size, std::vector<Record>* records) {
  static const unsigned char kDescriptor[4] = {'P', 'K', 7, 8};
  static const unsigned char kCentral[4] = {'P', 'K', 1, 2};
  for (Record& r : *records) {
    const uint64_t desc = r.data_offset + r.size;
    if (r.size > 0 && (desc + 8 > size || std::memcmp(file + desc, kDescriptor, 4) != 0))
      return Status::InvalidArgument("record " + r.name + ": no data descriptor after its data");
    if (r.central_offset + 46 > size || std::memcmp(file + r.central_offset, kCentral, 4) != 0)
      return Status::InvalidArgument("record " + r.name + ": no central directory entry at " +
                                     std::to_string(r.central_offset));
    r.crc32 = Crc32(file + r.data_offset, r.size);
    if (r.size > 0) Put32(file + desc + 4, r.crc32);
    Put32(file + r.central_offset + 16, r.crc32);
  }
  return Status::OK();
}

}  // namespace tce
