// Small text helpers shared by the daemon: byte sizes and request validation.
// Pure functions; any thread.
#pragma once

#include <cstdint>
#include <string>

#include "common/status.h"

namespace tce {

// "4096", "512MiB", "4GiB", "1.5GB", "2k" -> bytes. False on garbage.
bool ParseSize(const std::string& text, uint64_t* bytes);
// 1610612736 -> "1.5 GiB".
std::string HumanBytes(uint64_t bytes);

// An absolute, normalised path: non-empty, starts with '/', <= 4096 bytes, no
// NUL or control characters, no empty, "." or ".." components, no trailing '/'.
Status ValidatePath(const std::string& path);
// A job or tag name: <= 255 bytes, no control characters (tags: no '/').
Status ValidateName(const std::string& what, const std::string& value, bool allow_empty,
                    bool allow_slash);

}  // namespace tce
