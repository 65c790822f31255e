// The ofi transport: libfabric RMA writes into the receiver's buffer (see
// ring/transport.h). Built only with TCE_WITH_LIBFABRIC; reach it through
// NewTransport (ring/transport_factory.h).
#pragma once

#include <memory>

#include "common/status.h"
#include "ring/transport.h"

namespace tce {

// Opens the fabric `o` selects (provider, device filter, source host); a
// clear error saying why it cannot otherwise.
Status NewOfiTransport(const TransportOptions& o, std::unique_ptr<Transport>* out);

}  // namespace tce
