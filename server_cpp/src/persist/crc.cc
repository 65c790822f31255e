#include "persist/crc.h"

#include <unistd.h>
#include <zlib.h>
#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include <algorithm>
#include <cerrno>
#include <cstring>

namespace tce {

namespace {

uint32_t ZlibCrc32(uint32_t crc, const unsigned char* data, size_t n) {
  uLong c = crc;
  while (n > 0) {
    uInt chunk = n > (1u << 30) ? (1u << 30) : static_cast<uInt>(n);
    c = crc32(c, data, chunk);
    data += chunk;
    n -= chunk;
  }
  return static_cast<uint32_t>(c);
}

#if defined(__x86_64__)
// Carry-less multiplication folding (Intel, "Fast CRC Computation for Generic
// Polynomials Using PCLMULQDQ"), for the reflected zip polynomial. Works on
// the raw (not inverted) CRC state; `n` >= 64 and a multiple of 16.
__attribute__((target("pclmul,sse4.1"))) inline __m128i Fold(__m128i x, __m128i k, __m128i next) {
  return _mm_xor_si128(
      _mm_xor_si128(_mm_clmulepi64_si128(x, k, 0x00), _mm_clmulepi64_si128(x, k, 0x11)), next);
}

__attribute__((target("pclmul,sse4.1"))) uint32_t FoldRaw(uint32_t raw, const unsigned char* p,
                                                          size_t n) {
  const __m128i k12 = _mm_set_epi64x(0x1c6e41596LL, 0x154442bd4LL);  // x^(512+-32) mod P
  const __m128i k34 = _mm_set_epi64x(0x0ccaa009eLL, 0x1751997d0LL);  // x^(128+-32) mod P
  const __m128i k5 = _mm_set_epi64x(0, 0x163cd6124LL);               // x^64 mod P
  const __m128i ku = _mm_set_epi64x(0x1F7011641LL, 0x1DB710641LL);   // mu, P
  const __m128i mask32 = _mm_set_epi32(0, 0, 0, -1);
  auto load = [](const unsigned char* q) { return _mm_loadu_si128(reinterpret_cast<const __m128i*>(q)); };
  __m128i x1 = _mm_xor_si128(load(p), _mm_cvtsi32_si128(static_cast<int>(raw)));
  __m128i x2 = load(p + 16), x3 = load(p + 32), x4 = load(p + 48);
  p += 64;
  n -= 64;
  for (; n >= 64; p += 64, n -= 64) {
    x1 = Fold(x1, k12, load(p));
    x2 = Fold(x2, k12, load(p + 16));
    x3 = Fold(x3, k12, load(p + 32));
    x4 = Fold(x4, k12, load(p + 48));
  }
  x1 = Fold(Fold(Fold(x1, k34, x2), k34, x3), k34, x4);
  for (; n >= 16; p += 16, n -= 16) x1 = Fold(x1, k34, load(p));
  __m128i t = _mm_clmulepi64_si128(k34, x1, 0x01);  // 128 -> 64 bits
  x1 = _mm_xor_si128(_mm_srli_si128(x1, 8), t);
  t = _mm_clmulepi64_si128(_mm_and_si128(x1, mask32), k5, 0x00);  // 64 -> 32 bits
  x1 = _mm_xor_si128(_mm_srli_si128(x1, 4), t);
  t = _mm_clmulepi64_si128(_mm_and_si128(x1, mask32), ku, 0x10);  // Barrett reduction
  t = _mm_clmulepi64_si128(_mm_and_si128(t, mask32), ku, 0x00);
  return static_cast<uint32_t>(_mm_extract_epi32(_mm_xor_si128(x1, t), 1));
}

bool HavePclmul() {
  static const bool have = __builtin_cpu_supports("pclmul") && __builtin_cpu_supports("sse4.1");
  return have;
}
#endif

}  // namespace

uint32_t Crc32(uint32_t crc, const unsigned char* data, size_t n) {
#if defined(__x86_64__)
  if (n >= 64 && HavePclmul()) {
    const size_t bulk = n & ~size_t{15};
    crc = ~FoldRaw(~crc, data, bulk);
    data += bulk;
    n -= bulk;
  }
#endif
  return ZlibCrc32(crc, data, n);
}

ZipCrcStream::ZipCrcStream(std::vector<Record> records, uint64_t size, bool patch)
    : records_(std::move(records)), crc_(records_.size(), 0) {
  (void)size;
  for (size_t i = 0; patch && i < records_.size(); ++i) {
    const Record& r = records_[i];
    if (r.size > 0) fields_.push_back({r.data_offset + r.size + 4, i});  // data descriptor
    fields_.push_back({r.central_offset + 16, i});                      // central entry
  }
  std::sort(fields_.begin(), fields_.end(),
            [](const Field& a, const Field& b) { return a.offset < b.offset; });
}

void ZipCrcStream::Feed(uint64_t offset, unsigned char* chunk, size_t n) {
  const uint64_t end = offset + n;
  fed_ = end;
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

RecordCrcs::RecordCrcs(const std::vector<Record>& records) : crc_(records.size(), 0) {
  for (const Record& r : records) spans_.emplace_back(r.data_offset, r.data_offset + r.size);
}

void RecordCrcs::Feed(uint64_t offset, const unsigned char* chunk, size_t n) {
  const uint64_t end = offset + n;
  for (size_t i = next_; i < spans_.size(); ++i) {
    const auto [begin, stop] = spans_[i];
    if (begin >= end) break;  // records are in order: the rest come later
    const uint64_t from = std::max(begin, offset), to = std::min(stop, end);
    if (to > from) crc_[i] = Crc32(crc_[i], chunk + (from - offset), static_cast<size_t>(to - from));
    if (stop <= end && i == next_) ++next_;
  }
}

}  // namespace tce
