// Ranged reads of a file in a buffer: the checks and the copy shared by the
// peer port (PeerReadRange, serving a ring member) and the local ReadRange
// call. Offsets and lengths come from outside (a client, or a peer that is
// hostile input): CheckRange is the one place they are validated, without
// overflow, before any byte is read. Pure functions; any thread.
#pragma once

#include <cstdint>
#include <string>

#include "common/status.h"

namespace tce {

// The most one ranged read (one message) carries.
constexpr uint64_t kMaxRangeLength = 16u << 20;

// OK when 1 <= length <= kMaxRangeLength and [offset, offset + length) lies
// inside a file of `size` bytes; INVALID_ARGUMENT for a bad length,
// OUT_OF_RANGE (naming the numbers) for a range past the end.
Status CheckRange(uint64_t offset, uint64_t length, uint64_t size);

// Bytes [offset, offset + length) of `fd` (a memfd) into *out (resized),
// or into `to` (room for `length` bytes). The range must have passed
// CheckRange against the file's size.
Status ReadRangeOf(int fd, uint64_t offset, uint64_t length, std::string* out);
Status ReadRangeOf(int fd, uint64_t offset, uint64_t length, unsigned char* to);

// The CRC-32 of bytes [offset, offset + length) of `fd` (a memfd), read
// through a read-only mapping of just those pages (no copy). The range must
// have passed CheckRange against the file's size.
Status CrcOfRange(int fd, uint64_t offset, uint64_t length, uint32_t* crc);

}  // namespace tce
