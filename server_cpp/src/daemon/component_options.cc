#include "daemon/component_options.h"

#include <algorithm>

#include "common/net.h"
#include "ring/fabric_select.h"


namespace tce {

Status MakeSessionLimits(const Options& opt, uint64_t memory_budget, const MemoryLimits& limits,
                         SessionLimits* out, std::string* why) {
  out->root_is_admin = opt.root_is_admin;
  out->max_leases_per_session = static_cast<size_t>(opt.max_leases_per_session);
  out->version_lease = std::chrono::seconds(opt.version_lease_s);
  out->version_lease_max = std::chrono::seconds(std::max(opt.version_lease_s, opt.version_lease_max_s));
  (void)ParseReadGrants(opt.read_grants, &out->read_grants);  // checked with the settings
  MetadataLimits& m = out->metadata;
  Status s = ResolveMetadataBudget(opt.metadata_budget, memory_budget, limits, &m.budget, why);
  if (!s.ok()) return Status::InvalidArgument("metadata_budget: " + s.message());
  m.share_per_uid_percent = static_cast<unsigned>(opt.metadata_share_per_uid);
  m.max_jobs_per_uid = static_cast<size_t>(opt.max_jobs_per_uid);
  m.max_tags_per_job = static_cast<size_t>(opt.max_tags_per_job);
  m.max_grants_per_job = static_cast<size_t>(opt.max_grants_per_job);
  m.max_version_leases_per_uid = static_cast<size_t>(opt.max_version_leases_per_uid);
  return Status::OK();
}

TransportOptions MakeTransportOptions(const Options& opt) {
  TransportOptions to;
  to.name = opt.ring_transport;
  to.ofi_provider = opt.ofi_provider;
  to.streams = opt.ring_streams;
  std::string variable;
  to.ofi_devices = DeviceSpecFromEnv(&variable);
  int ignored_port;
  if (!ParseEndpoint(opt.peer_advertise.empty() ? opt.peer_listen : opt.peer_advertise, &to.source_host,
                     &ignored_port).ok())
    to.source_host.clear();
  if (to.source_host == "0.0.0.0" || to.source_host == "::") to.source_host.clear();
  to.io_timeout = std::chrono::milliseconds(opt.peer_timeout_ms);
  return to;
}

}  // namespace tce
