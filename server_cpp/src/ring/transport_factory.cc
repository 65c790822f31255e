#include "ring/transport_factory.h"

#include "ring/peer_link.h"
#include "ring/tcp_transport.h"

#ifndef TCE_WITH_LIBFABRIC
#error "the build defines TCE_WITH_LIBFABRIC as 1 or 0 (CMake option TCE_WITH_LIBFABRIC)"
#endif
#if TCE_WITH_LIBFABRIC
#include "ring/fabric_info.h"
#include "ring/ofi_transport.h"
#endif

namespace tce {
namespace {

#if !TCE_WITH_LIBFABRIC
Status WithoutLibfabric(const std::string& what) {
  return Status::NotSupported(what + " needs libfabric, and this tce-server was built without it "
                              "(CMake option TCE_WITH_LIBFABRIC=OFF); rebuild with libfabric "
                              "(Debian: libfabric-dev) to use it");
}
#endif

}  // namespace

Status NewTransport(const TransportOptions& o, std::unique_ptr<Transport>* out) {
  if (o.name == "tcp") {
    if (o.streams < 1 || o.streams > kMaxLanes)
      return Status::InvalidArgument("tcp streams must be 1 to " + std::to_string(kMaxLanes));
    *out = NewTcpTransport(o.streams);
    return Status::OK();
  }
  if (o.name == "ofi") {
#if TCE_WITH_LIBFABRIC
    return NewOfiTransport(o, out);
#else
    return WithoutLibfabric("the ofi transport");
#endif
  }
  return Status::InvalidArgument("unknown ring transport '" + o.name + "' (tcp, ofi)");
}

Status FabricInfo(const std::string& provider, int local_ranks, std::string* json) {
#if TCE_WITH_LIBFABRIC
  *json = FabricInfoJson(provider, local_ranks);
  return Status::OK();
#else
  (void)provider;
  (void)local_ranks;
  json->clear();
  return WithoutLibfabric("the fabric listing");
#endif
}

}  // namespace tce
