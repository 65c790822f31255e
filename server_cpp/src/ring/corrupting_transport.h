// A fault-injecting Transport decorator, for tests only: wire corruption
// cannot be caused for real (TCP checksums it away), so this one flips one
// byte in the middle of every transfer it sends, and the receiver's CRC
// check must refuse the copy. Built into the gtests and tce-server-faulty
// (TCE_BUILD_TESTS), never into tce-server. Thread-safe as `inner` is.
#pragma once

#include <memory>

#include "ring/transport.h"

namespace tce {

std::unique_ptr<Transport> NewCorruptingTransport(std::unique_ptr<Transport> inner);

}  // namespace tce
