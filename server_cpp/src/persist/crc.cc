#include "persist/crc.h"

#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

namespace tce {

uint32_t Crc32(uint32_t crc, const unsigned char* data, size_t n) {
  uLong c = crc;
  while (n > 0) {
    uInt chunk = n > (1u << 30) ? (1u << 30) : static_cast<uInt>(n);
    c = crc32(c, data, chunk);
    data += chunk;
    n -= chunk;
  }
  return static_cast<uint32_t>(c);
}

ZipCrcStream::ZipCrcStream(std::vector<Record> records, uint64_t size)
    : records_(std::move(records)), crc_(records_.size(), 0) {
  (void)size;
  for (size_t i = 0; i < records_.size(); ++i) {
    const Record& r = records_[i];
    if (r.size > 0) fields_.push_back({r.data_offset + r.size + 4, i});  // data descriptor
    fields_.push_back({r.central_offset + 16, i});                      // central entry
  }
  std::sort(fields_.begin(), fields_.end(),
            [](const Field& a, const Field& b) { return a.offset < b.offset; });
}

void ZipCrcStream::Feed(uint64_t offset, unsigned char* chunk, size_t n) {
  const uint64_t end = offset + n;
  // 1. Hash the record data inside [offset, end).
  for (size_t i = next_record_; i < records_.size(); ++i) {
    const Record& r = records_[i];
    const uint64_t a = std::max(offset, r.data_offset), b = std::min(end, r.data_offset + r.size);
    if (r.data_offset >= end) break;
    if (a < b) crc_[i] = Crc32(crc_[i], chunk + (a - offset), b - a);
    if (r.data_offset + r.size <= end && i == next_record_) ++next_record_;
  }
  // 2. Patch the CRC fields (or their parts) inside [offset, end).
  while (next_field_ < fields_.size()) {
    const Field& f = fields_[next_field_];
    if (f.offset >= end) break;
    unsigned char bytes[4];
    const uint32_t crc = crc_[f.record];
    for (int k = 0; k < 4; ++k) bytes[k] = static_cast<unsigned char>(crc >> (8 * k));
    for (int k = 0; k < 4; ++k) {
      const uint64_t at = f.offset + k;
      if (at >= offset && at < end) chunk[at - offset] = bytes[k];
    }
    if (f.offset + 4 > end) break;  // the rest lands in the next chunk
    ++next_field_;
  }
  for (size_t i = 0; i < records_.size(); ++i) records_[i].crc32 = crc_[i];
}

Status ValidateZipTable(int fd, uint64_t size, const std::vector<Record>& records) {
  auto has = [&](uint64_t at, const char* sig) {
    char got[4];
    return at + 4 <= size && pread(fd, got, 4, static_cast<off_t>(at)) == 4 &&
           std::memcmp(got, sig, 4) == 0;
  };
  for (const Record& r : records) {
    if (r.size > 0 && (r.data_offset + r.size + 8 > size || !has(r.data_offset + r.size, "PK\x07\x08")))
      return Status::InvalidArgument("record " + r.name + ": no data descriptor after its data");
    if (r.central_offset + 46 > size || !has(r.central_offset, "PK\x01\x02"))
      return Status::InvalidArgument("record " + r.name + ": no central directory entry at " +
                                     std::to_string(r.central_offset));
  }
  return Status::OK();
}

}  // namespace tce
