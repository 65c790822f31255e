// The tcp transport: sendfile() from the sender's memfd, recv() into the
// receiver's buffer, striped over `streams` connections per link (see
// ring/transport.h). Always built.
#pragma once

#include <memory>

#include "ring/transport.h"

namespace tce {

std::unique_ptr<Transport> NewTcpTransport(int streams = 1);

}  // namespace tce
