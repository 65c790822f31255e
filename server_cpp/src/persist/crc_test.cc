#include "persist/crc.h"

#include <gtest/gtest.h>
#include <unistd.h>
#include <zlib.h>

#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "cache/buffer.h"
#include "persist/persister_fixture.h"

namespace tce {
namespace {

TEST(Crc, StreamingInAnyChunkSizeMatchesOnePass) {
  // Two records, chunk sizes that split records, descriptors and CRC fields
  // anywhere (the original engine lost a chunk on odd counts: test them all).
  const uint64_t kSize = 400;
  std::vector<unsigned char> file(kSize, 0);
  for (size_t i = 64; i < 164; ++i) file[i] = static_cast<unsigned char>(i * 7);
  std::memcpy(&file[164], "PK\x07\x08", 4);
  for (size_t i = 192; i < 229; ++i) file[i] = static_cast<unsigned char>(i * 13);
  std::memcpy(&file[229], "PK\x07\x08", 4);
  std::memcpy(&file[300], "PK\x01\x02", 4);
  std::memcpy(&file[346], "PK\x01\x02", 4);
  std::vector<Record> recs = {{"a", 0, 64, 100, 0, 300}, {"b", 180, 192, 37, 0, 346}};
  uint32_t ca = crc32(0, &file[64], 100), cb = crc32(0, &file[192], 37);
  for (size_t chunk = 1; chunk <= kSize; ++chunk) {
    std::vector<unsigned char> out = file;
    ZipCrcStream s(recs, kSize);
    for (uint64_t off = 0; off < kSize; off += chunk) {
      size_t n = static_cast<size_t>(std::min<uint64_t>(chunk, kSize - off));
      s.Feed(off, &out[off], n);
    }
    ASSERT_EQ(s.records()[0].crc32, ca) << chunk;
    ASSERT_EQ(s.records()[1].crc32, cb) << chunk;
    ASSERT_EQ(Get32(std::string(out.begin(), out.end()), 168), ca) << chunk;
    ASSERT_EQ(Get32(std::string(out.begin(), out.end()), 233), cb) << chunk;
    ASSERT_EQ(Get32(std::string(out.begin(), out.end()), 316), ca) << chunk;
    ASSERT_EQ(Get32(std::string(out.begin(), out.end()), 362), cb) << chunk;
  }
}

TEST(Crc, MatchesZlibForEveryLengthAndAlignment) {
  std::vector<unsigned char> b(8192);
  uint32_t seed = 12345;
  for (auto& c : b) c = static_cast<unsigned char>((seed = seed * 1103515245 + 12345) >> 16);
  for (size_t off = 0; off < 17; ++off) {
    for (size_t n = 0; n + off <= b.size(); n += (n < 300 ? 1 : 97)) {
      uint32_t want = crc32(0, b.data() + off, static_cast<uInt>(n));
      ASSERT_EQ(Crc32(0, b.data() + off, n), want) << "off=" << off << " n=" << n;
      // chaining from a non-zero CRC, as streaming does
      ASSERT_EQ(Crc32(want, b.data(), 100), crc32(want, b.data(), 100)) << n;
    }
  }
}

TEST(Crc, ValidateRejectsAWrongTable) {
  std::unique_ptr<Buffer> b;
  ASSERT_TRUE(Buffer::Create(1, FakeZip::kSize, &b).ok());
  std::vector<unsigned char> file(FakeZip::kSize);
  FakeZip::Fill(file.data(), 'z');
  ASSERT_EQ(pwrite(b->fd(), file.data(), file.size(), 0), static_cast<ssize_t>(file.size()));
  std::vector<Record> records = FakeZip::Records();
  EXPECT_TRUE(ValidateZipTable(b->fd(), FakeZip::kSize, records).ok());
  records[0].central_offset = 10;
  EXPECT_EQ(ValidateZipTable(b->fd(), FakeZip::kSize, records).code(), Status::Code::kInvalidArgument);
  records = FakeZip::Records();
  records[0].size -= 1;
  EXPECT_EQ(ValidateZipTable(b->fd(), FakeZip::kSize, records).code(), Status::Code::kInvalidArgument);
}

TEST(RecordCrcs, AnyChunkingGivesTheWholeRecordCrcs) {
  std::vector<unsigned char> data(100000);
  for (size_t i = 0; i < data.size(); ++i) data[i] = static_cast<unsigned char>(i * 131 + 7);
  std::vector<Record> records = {{"r0", 0, 64, 0, 0, 0},        // empty
                                 {"r1", 64, 128, 40000, 0, 0},
                                 {"r2", 40200, 40264, 59000, 0, 0}};
  for (size_t chunk : {1u, 7u, 4096u, 65536u, 1000000u}) {
    RecordCrcs crcs(records);
    for (size_t off = 0; off < data.size(); off += chunk)
      crcs.Feed(off, data.data() + off, std::min(chunk, data.size() - off));
    for (size_t i = 0; i < records.size(); ++i)
      EXPECT_EQ(crcs.crcs()[i], Crc32(0, data.data() + records[i].data_offset, records[i].size))
          << "chunk " << chunk << " record " << i;
  }
}

}  // namespace
}  // namespace tce
