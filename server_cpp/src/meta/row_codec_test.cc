// The metadata column decoders take bytes from a database file anyone with
// write access may have damaged: a bounded random-input loop (a fuzz target
// that runs in ctest) checks they never crash and answer OK or DATA_LOSS.
#include "meta/row_codec.h"

#include <gtest/gtest.h>

#include <limits>
#include <random>

namespace tce {
namespace {

constexpr int kIterations = 20000;

std::string Mutate(std::string s, std::mt19937_64& rng) {
  const int edits = 1 + static_cast<int>(rng() % 4);
  static const char kAlphabet[] = "0123456789: \n-/ax\xff";
  for (int e = 0; e < edits; ++e) {
    const size_t at = s.empty() ? 0 : rng() % (s.size() + 1);
    switch (rng() % 5) {
      case 0: if (at < s.size()) s.erase(at, 1 + rng() % 8); break;
      case 1: s.insert(at, 1, kAlphabet[rng() % (sizeof(kAlphabet) - 1)]); break;
      case 2: if (at < s.size()) s[at] = static_cast<char>(rng()); break;
      case 3: s.insert(at, std::to_string(rng())); break;
      default: s = s.substr(0, at); break;
    }
  }
  return s;
}

std::string RandomBytes(std::mt19937_64& rng) {
  std::string s(rng() % 64, '\0');
  for (char& c : s) c = "0123456789: \n-x\0\xff"[rng() % 16];
  return s;
}

void ExpectOkOrDataLoss(const Status& s, const std::string& input) {
  EXPECT_TRUE(s.ok() || s.code() == Status::Code::kDataLoss) << s.ToString() << " for " << Printable(input);
}

std::vector<Record> SomeRecords(std::mt19937_64& rng) {
  std::vector<Record> out(rng() % 4);
  for (Record& r : out) {
    r.name = RandomBytes(rng);
    r.header_offset = rng();
    r.data_offset = rng() % 1000;
    r.size = rng();
    r.central_offset = rng() % 7;
    r.crc32 = static_cast<uint32_t>(rng());
  }
  return out;
}

TEST(RowCodec, RecordsRoundTripAndSurviveRandomAndMutatedInput) {
  std::mt19937_64 rng(1313);
  for (int i = 0; i < kIterations; ++i) {
    std::vector<Record> records = SomeRecords(rng), back;
    const std::string text = EncodeRecords(records);
    ASSERT_TRUE(DecodeRecords(text, &back).ok()) << Printable(text);
    ASSERT_EQ(back.size(), records.size());
    for (size_t k = 0; k < back.size(); ++k) {
      EXPECT_EQ(back[k].name, records[k].name);
      EXPECT_EQ(back[k].size, records[k].size);
      EXPECT_EQ(back[k].crc32, records[k].crc32);
    }
    for (const std::string& bad : {Mutate(text, rng), RandomBytes(rng)}) {
      std::vector<Record> out;
      Status s = DecodeRecords(bad, &out);
      ExpectOkOrDataLoss(s, bad);
      if (!s.ok()) EXPECT_TRUE(out.empty());  // all or nothing
    }
  }
  std::vector<Record> out;
  EXPECT_EQ(DecodeRecords("abc:def", &out).code(), Status::Code::kDataLoss);
  EXPECT_EQ(DecodeRecords("99999999999999999999999:x", &out).code(), Status::Code::kDataLoss);
  EXPECT_EQ(DecodeRecords("1:x 1 2 3 4 4294967296\n", &out).code(), Status::Code::kDataLoss);  // crc > 32 bits
  EXPECT_EQ(DecodeRecords("1:x 1 2 -3 4 5\n", &out).code(), Status::Code::kDataLoss);
}

TEST(RowCodec, TagFilesRoundTripAndSurviveRandomAndMutatedInput) {
  std::mt19937_64 rng(1314);
  for (int i = 0; i < kIterations; ++i) {
    std::vector<TagFile> files(rng() % 4), back;
    for (TagFile& f : files) {
      f.rank = static_cast<int32_t>(rng() % 1000);
      f.size = rng();
      f.path = "/" + RandomBytes(rng);
    }
    const std::string text = EncodeTagFiles(files);
    ASSERT_TRUE(DecodeTagFiles(text, &back).ok()) << Printable(text);
    ASSERT_EQ(back.size(), files.size());
    for (size_t k = 0; k < back.size(); ++k) EXPECT_EQ(back[k].path, files[k].path);
    for (const std::string& bad : {Mutate(text, rng), RandomBytes(rng)}) {
      std::vector<TagFile> out;
      ExpectOkOrDataLoss(DecodeTagFiles(bad, &out), bad);
    }
  }
  std::vector<TagFile> out;
  EXPECT_EQ(DecodeTagFiles("0 1 10:/c/a.pt\n", &out).code(), Status::Code::kDataLoss);  // length lies
  EXPECT_EQ(DecodeTagFiles("-1 1 2:/a\n", &out).code(), Status::Code::kDataLoss);
}

TEST(RowCodec, EndpointsAndNumbersSurviveRandomInput) {
  std::mt19937_64 rng(1315);
  for (int i = 0; i < kIterations; ++i) {
    const std::string bad = RandomBytes(rng);
    std::vector<std::string> endpoints;
    ExpectOkOrDataLoss(DecodeEndpoints(bad, &endpoints), bad);
    int64_t v;
    uint64_t u;
    (void)ParseInt64(bad, &v);
    (void)ParseUint64(bad, &u);
    const int64_t n = static_cast<int64_t>(rng());
    ASSERT_TRUE(ParseInt64(std::to_string(n), &v));
    EXPECT_EQ(v, n);
  }
  int64_t v;
  uint64_t u;
  EXPECT_TRUE(ParseInt64("-9223372036854775808", &v));
  EXPECT_EQ(v, std::numeric_limits<int64_t>::min());
  EXPECT_FALSE(ParseInt64("9223372036854775808", &v));
  EXPECT_TRUE(ParseUint64("18446744073709551615", &u));
  EXPECT_FALSE(ParseUint64("18446744073709551616", &u));
  for (const char* bad : {"", "-", "1.5", " 1", "1 ", "+1", "abc", "0x10"}) EXPECT_FALSE(ParseInt64(bad, &v)) << bad;
}

TEST(RowCodec, PrintableEscapes) {
  EXPECT_EQ(Printable(std::string("/a\0b\n\xff", 6)), "/a\\x00b\\x0a\\xff");
  EXPECT_EQ(Printable(std::string(10, 'x'), 4), "xxxx...");
}

}  // namespace
}  // namespace tce
