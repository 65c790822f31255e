// Input limits and checks for everything that enters the daemon from outside
// (control RPCs, metadata rows): the one place the limits are named. Pure
// functions; any thread. Every Status they return is INVALID_ARGUMENT with a
// message that starts with the field's name, e.g. "path: contains NUL".
// Nothing here trusts its input: any byte string may be passed.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "common/status.h"

namespace tce {

// Paths name files on Linux: PATH_MAX and NAME_MAX.
constexpr size_t kMaxPathBytes = 4096;
constexpr size_t kMaxPathComponentBytes = 255;
// Job and tag names (MySQL keys them as VARCHAR(255)).
constexpr size_t kMaxNameBytes = 255;
// Session ids are made by the server; anything longer is not one.
constexpr size_t kMaxSessionBytes = 128;
// A ring endpoint, host:port.
constexpr size_t kMaxEndpointBytes = 255;
// Zip record names (a 16-bit length in the zip format).
constexpr size_t kMaxRecordNameBytes = 65535;
// Counts of repeated fields in one request.
constexpr size_t kMaxRecordsPerFile = 1 << 20;
constexpr size_t kMaxFilesPerTag = 1 << 20;
constexpr size_t kMaxPathsPerWait = 1 << 16;
constexpr size_t kMaxRingNodes = 1 << 12;
constexpr size_t kMaxIdsPerRelease = 1 << 16;
// Ranks and world sizes: int32 on the wire, never negative.
constexpr int32_t kMaxWorldSize = 1 << 20;
// A Wait timeout longer than this (or <= 0, or +inf) waits as long as it
// takes; NaN is refused. About 115 days: beyond any checkpoint's persist.
constexpr double kMaxWaitTimeoutS = 1e7;

// Whether `s` is well-formed UTF-8 (no overlong forms, surrogates or code
// points past U+10FFFF).
bool IsValidUtf8(const std::string& s);

// UTF-8, no NUL, at most `max_bytes`; empty only when `allow_empty`.
Status ValidateText(const std::string& field, const std::string& value, size_t max_bytes,
                    bool allow_empty);
// An absolute, normalised path: non-empty, starts with '/', <= kMaxPathBytes,
// each component <= kMaxPathComponentBytes, valid UTF-8, no NUL or control
// characters, no empty, "." or ".." components, no trailing '/'.
Status ValidatePath(const std::string& path, const std::string& field = "path");
// A job or tag name: <= kMaxNameBytes, UTF-8, no NUL or control characters
// (tags: no '/').
Status ValidateName(const std::string& what, const std::string& value, bool allow_empty,
                    bool allow_slash);
// A rank: 0 <= value < kMaxWorldSize.
Status ValidateRank(const std::string& field, int64_t value);
// Wait's timeout_s -> milliseconds to wait; 0 means no limit. A positive
// timeout waits at least 1 ms (it never rounds down to "no limit").
Status WaitTimeoutMs(double timeout_s, int64_t* ms);

}  // namespace tce
