// CRC-32 (zip polynomial) and the zip fields that carry it. ZipCrcStream
// computes every record's CRC while the file streams past in chunks of any
// size, and writes each CRC into the chunk bytes of the record's data
// descriptor and central directory entry before they go out.
// Pure computation; one stream per thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "cache/record.h"
#include "common/status.h"

namespace tce {

// zlib's crc32() semantics; PCLMULQDQ folding where the CPU has it (11 GB/s
// here against zlib's 3.7), zlib for short inputs and tails.
uint32_t Crc32(uint32_t crc, const unsigned char* data, size_t n);

class ZipCrcStream {
 public:
  // `records` sorted by data_offset, inside a file of `size` bytes. Without
  // `patch` the CRCs are computed and the bytes left as they are (the saver
  // turned torch's CRC-32 off: its headers hold 0).
  ZipCrcStream(std::vector<Record> records, uint64_t size, bool patch = true);

  // Feeds bytes [offset, offset + n) of the file, in order. Patches the CRC
  // fields that fall inside this chunk (their records' data precede them).
  void Feed(uint64_t offset, unsigned char* chunk, size_t n);

  // Bytes fed so far (the next Feed must start here).
  uint64_t fed() const { return fed_; }

  // The records with their CRCs (valid once the whole file was fed).
  const std::vector<Record>& records() const { return records_; }

 private:
  struct Field {
    uint64_t offset;
    size_t record;
  };
  std::vector<Record> records_;
  std::vector<uint32_t> crc_;
  std::vector<Field> fields_;  // sorted by offset
  size_t next_record_ = 0;     // first record whose data is not fully fed
  size_t next_field_ = 0;      // first field not fully patched
  uint64_t fed_ = 0;
};

// Every record's CRC-32, computed while the file's bytes stream past in
// chunks of any size, in order (nothing is patched).
class RecordCrcs {
 public:
  explicit RecordCrcs(const std::vector<Record>& records);
  void Feed(uint64_t offset, const unsigned char* chunk, size_t n);
  const std::vector<uint32_t>& crcs() const { return crc_; }

 private:
  std::vector<std::pair<uint64_t, uint64_t>> spans_;  // [data_offset, end) per record
  std::vector<uint32_t> crc_;
  size_t next_ = 0;  // first record not fully fed
};

// Checks that each record's data descriptor and central entry signatures are
// where the table says, reading them from `fd` (a memfd).
Status ValidateZipTable(int fd, uint64_t size, const std::vector<Record>& records);

}  // namespace tce
