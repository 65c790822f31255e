// Fault injection for tests (wire corruption cannot be caused for real: TCP
// checksums it away): wraps `inner` and flips one byte in the middle of
// every transfer it sends.
#pragma once

#include <memory>

#include "ring/transport.h"

namespace tce {

std::unique_ptr<Transport> NewCorruptingTransport(std::unique_ptr<Transport> inner);

}  // namespace tce
