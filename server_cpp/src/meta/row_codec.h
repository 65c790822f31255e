// The text columns both metadata stores keep (records, a tag's files, a
// ring's endpoints), and the checks a row read back must pass before the
// server trusts it. A database file can be damaged or edited by anyone who
// can write it, so every decoder takes any bytes: it returns DATA_LOSS
// naming what is wrong, never throws, never reads past its input, and
// allocates at most in proportion to it. Pure functions; any thread.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "cache/cache_types.h"
#include "common/status.h"

namespace tce {

// A line per record: "<name length>:<name> header data size central crc".
std::string EncodeRecords(const std::vector<Record>& records);
Status DecodeRecords(const std::string& text, std::vector<Record>* out);

// A line per file: "rank size <path length>:<path>".
std::string EncodeTagFiles(const std::vector<TagFile>& files);
Status DecodeTagFiles(const std::string& text, std::vector<TagFile>* out);

// One endpoint per line.
std::string EncodeEndpoints(const std::vector<std::string>& endpoints);
Status DecodeEndpoints(const std::string& text, std::vector<std::string>* out);

// Strict decimal integers (what MySQL hands back as text): optional '-' (for
// the signed one), digits only, no overflow.
bool ParseInt64(const std::string& text, int64_t* out);
bool ParseUint64(const std::string& text, uint64_t* out);

// Whether a file row's keys are what the server could have written: job and
// tag names, an absolute path (common/validate.h).
Status CheckFileKeys(const FileInfo& f);
// The same for a tag row and its files.
Status CheckTag(const TagInfo& t);

// `s` for a log line: bytes outside printable ASCII as \xNN, at most
// `max` bytes of input shown (then "...").
std::string Printable(const std::string& s, size_t max = 256);

}  // namespace tce
