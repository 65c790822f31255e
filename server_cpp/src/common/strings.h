// Small text helpers shared by the daemon: byte sizes (and, through
// common/validate.h, request validation).
// Pure functions; any thread.
#pragma once

#include <cstdint>
#include <string>

#include "common/status.h"
#include "common/validate.h"

namespace tce {

// "4096", "512MiB", "4GiB", "1.5GB", "2k" -> bytes. False on garbage.
bool ParseSize(const std::string& text, uint64_t* bytes);
// 1610612736 -> "1.5 GiB".
std::string HumanBytes(uint64_t bytes);

}  // namespace tce
