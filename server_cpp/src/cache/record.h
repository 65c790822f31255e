// Record: where one entry of a torch-zip file sits in the file's bytes, and
// its CRC-32. Plain data, shared by the cache, the persister's CRC code and
// the ring's checks.
#pragma once

#include <cstdint>
#include <string>

namespace tce {

struct Record {
  std::string name;
  uint64_t header_offset = 0;
  uint64_t data_offset = 0;
  uint64_t size = 0;
  uint32_t crc32 = 0;
  uint64_t central_offset = 0;
};

}  // namespace tce
