// CRC-32 (zip polynomial) of a byte range, and the zip fields that carry it.
// Pure functions; any thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "cache/cache.h"
#include "common/status.h"

namespace tce {

uint32_t Crc32(const unsigned char* data, size_t n);

// Computes each record's CRC over `file` (of `size` bytes) and writes it into
// the record's data descriptor and central directory entry, after checking
// both are where the record table says. Fills records[i].crc32.
Status FillZipCrcs(unsigned char* file, uint64_t size, std::vector<Record>* records);

}  // namespace tce
