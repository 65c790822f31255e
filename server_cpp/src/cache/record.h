// Record: where one entry of a torch-zip file sits in the file's bytes, and
// its CRC-32. Plain data, shared by the cache, the persister's CRC code and
// the ring's checks.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace tce {

struct Record {
  std::string name;
  uint64_t header_offset = 0;
  uint64_t data_offset = 0;
  uint64_t size = 0;
  uint32_t crc32 = 0;
  uint64_t central_offset = 0;
};

// A file that is not a torch zip (a DCP data file, any raw allocation) has
// no records; on the ring it travels with these instead: consecutive byte
// ranges of at most kCheckRange bytes that tile [0, size), each with a CRC
// the receiver checks, as it checks a zip's records. They are the transfer's,
// never the file's: a copy pulled back drops them.
constexpr uint64_t kCheckRange = uint64_t{64} << 20;

inline std::vector<Record> CheckRanges(uint64_t size) {
  std::vector<Record> out;
  for (uint64_t off = 0; off < size; off += kCheckRange) {
    Record r;
    r.name = "range";
    r.header_offset = off;
    r.data_offset = off;
    r.size = size - off < kCheckRange ? size - off : kCheckRange;
    out.push_back(r);
  }
  return out;
}

}  // namespace tce
