#include "rpc/request_checks.h"

#include <algorithm>
#include <cmath>
#include <string>

#include "cache/tag_proto.h"
#include "common/validate.h"

namespace tce {
namespace {

// Sessions are checked for form only; the cache decides whether one exists.
Status Session(const std::string& s) { return ValidateText("session", s, kMaxSessionBytes, true); }
Status Job(const std::string& j, bool allow_empty = false) {
  return ValidateName("job", j, allow_empty, /*allow_slash=*/true);
}
Status Tag(const std::string& t, const std::string& field = "tag") {
  return ValidateName(field, t, /*allow_empty=*/true, /*allow_slash=*/false);
}
Status Count(const char* field, size_t n, size_t max) {
  if (n <= max) return Status::OK();
  return Status::InvalidArgument(std::string(field) + ": " + std::to_string(n) +
                                 " entries, more than " + std::to_string(max));
}
std::string Nth(const char* field, int i) { return std::string(field) + "[" + std::to_string(i) + "]"; }

// Runs checks in order; the first failure wins.
template <typename... Checks>
Status First(Checks&&... checks) {
  Status s;
  ((s.ok() ? (void)(s = checks()) : (void)0), ...);
  return s;
}

// A length of time in seconds as a request gives it: NaN is refused; <= 0
// is 0 (none asked); more than kMaxWaitTimeoutS (+inf included) is that
// many; else at least 1 ms.
Status SecondsMs(const char* field, double seconds, int64_t* ms) {
  if (std::isnan(seconds)) return Status::InvalidArgument(std::string(field) + ": is NaN");
  if (seconds <= 0) {
    *ms = 0;
    return Status::OK();
  }
  seconds = std::min<double>(seconds, kMaxWaitTimeoutS);
  *ms = std::max<int64_t>(1, static_cast<int64_t>(std::ceil(seconds * 1000)));
  return Status::OK();
}

// The object identity a ranged read pins: an ETag as S3 gives one (1 to
// 256 visible ASCII characters, no quotes), its size only with it.
Status ExpectedObject(const v1::ReadRangeRequest& r) {
  const std::string& etag = r.expect_etag();
  if (etag.empty()) {
    return r.expect_size() == 0 ? Status::OK()
                                : Status::InvalidArgument("expect_size: given without expect_etag");
  }
  const bool visible = std::all_of(etag.begin(), etag.end(), [](char c) { return c > 0x20 && c < 0x7f && c != '"'; });
  if (etag.size() > 256 || !visible)
    return Status::InvalidArgument("expect_etag: not an ETag (1 to 256 visible ASCII characters, no quotes)");
  return Status::OK();
}

constexpr size_t kMaxGrantIds = 1024;
constexpr size_t kMaxFollowSources = 64;

}  // namespace

Status CheckRequest(const v1::GetVersionRequest& r, int64_t* wait_ms) {
  return First([&] { return Session(r.session()); }, [&] { return Job(r.job()); },
               [&] { return SecondsMs("timeout_s", r.timeout_s(), wait_ms); });
}

Status CheckRequest(const v1::AcquireVersionRequest& r, int64_t* lease_ms) {
  Status s = First([&] { return Session(r.session()); }, [&] { return Job(r.job()); },
                   [&] { return SecondsMs("lease_s", r.lease_s(), lease_ms); },
                   [&] { return Count("paths", r.paths_size(), kMaxPathsPerWait); });
  for (int i = 0; s.ok() && i < r.paths_size(); ++i) s = ValidatePath(r.paths(i), Nth("paths", i));
  return s;
}

Status CheckRequest(const v1::FollowRequest& r) {
  Status s = First([&] { return Session(r.session()); }, [&] { return Job(r.job()); },
                   [&] { return Count("sources", r.sources_size(), kMaxFollowSources); });
  if (s.ok() && r.sources_size() == 0) s = Status::InvalidArgument("sources: name at least one node");
  for (int i = 0; s.ok() && i < r.sources_size(); ++i)
    s = ValidateText(Nth("sources", i), r.sources(i), kMaxEndpointBytes, false);
  return s;
}

Status CheckRequest(const v1::RenewVersionRequest& r, int64_t* lease_ms) {
  return First([&] { return Session(r.session()); },
               [&] { return SecondsMs("lease_s", r.lease_s(), lease_ms); });
}

Status CheckRequest(const v1::ReleaseVersionRequest& r) { return Session(r.session()); }

Status CheckRequest(const v1::GrantReadRequest& r) {
  Status s = First([&] { return Session(r.session()); }, [&] { return Job(r.job()); },
                   [&] { return Count("uids", r.uids_size(), kMaxGrantIds); },
                   [&] { return Count("gids", r.gids_size(), kMaxGrantIds); },
                   [&] { return Count("nodes", r.nodes_size(), kMaxGrantIds); });
  for (int i = 0; s.ok() && i < r.nodes_size(); ++i) {
    s = ValidateText(Nth("nodes", i), r.nodes(i), kMaxEndpointBytes, false);
    if (s.ok() && r.nodes(i).find(':') == std::string::npos)
      s = Status::InvalidArgument(Nth("nodes", i) + ": a node is its peer endpoint, host:port");
  }
  return s;
}

Status CheckRequest(const v1::AllocateRequest& r) {
  return First([&] { return Session(r.session()); }, [&] { return Job(r.job()); },
               [&] { return Tag(r.tag()); }, [&] { return ValidatePath(r.path()); },
               [&] { return ValidateRank("rank", r.rank()); });
}

Status CheckRequest(const v1::CommitRequest& r) {
  Status s = First([&] { return Session(r.session()); },
                   [&] { return Count("records", r.records_size(), kMaxRecordsPerFile); });
  for (int i = 0; s.ok() && i < r.records_size(); ++i)
    s = ValidateText(Nth("records", i) + ".name", r.records(i).name(), kMaxRecordNameBytes, true);
  return s;
}

Status CheckRequest(const v1::AbortRequest& r) { return Session(r.session()); }

Status CheckRequest(const v1::LookupRequest& r) {
  return First([&] { return Session(r.session()); }, [&] { return Job(r.job()); },
               [&] { return ValidatePath(r.path()); });
}

Status CheckRequest(const v1::ReadRangeRequest& r) {
  return First([&] { return Session(r.session()); }, [&] { return Job(r.job()); },
               [&] { return ValidatePath(r.path()); }, [&] { return ExpectedObject(r); });
}

Status CheckRequest(const v1::ReleaseRequest& r) {
  return First([&] { return Session(r.session()); },
               [&] { return Count("lease_ids", r.lease_ids_size(), kMaxIdsPerRelease); },
               [&] {
                 return Count("unmapped_buffer_ids", r.unmapped_buffer_ids_size(), kMaxIdsPerRelease);
               });
}

Status CheckRequest(const v1::RemoveRequest& r) {
  return First([&] { return Session(r.session()); }, [&] { return Job(r.job()); },
               [&] { return ValidatePath(r.path()); });
}

Status CheckRequest(const v1::ListRequest& r) {
  return First([&] { return Session(r.session()); },
               [&] { return Job(r.job(), /*allow_empty=*/r.storage_dir().empty()); }, [&] { return Tag(r.tag()); },
               [&] { return r.storage_dir().empty() ? Status::OK() : ValidatePath(r.storage_dir(), "storage_dir"); });
}

Status CheckRequest(const v1::StatusRequest& r) { return Session(r.session()); }

Status CheckRequest(const v1::RetryRequest& r) {
  Status s = First([&] { return Session(r.session()); }, [&] { return Job(r.job()); },
                   [&] { return Count("paths", r.paths_size(), kMaxPathsPerWait); });
  for (int i = 0; s.ok() && i < r.paths_size(); ++i) s = ValidatePath(r.paths(i), Nth("paths", i));
  return s;
}

Status CheckRequest(const v1::WaitRequest& r, int64_t* timeout_ms) {
  Status s = First([&] { return Session(r.session()); }, [&] { return Job(r.job()); },
                   [&] { return Count("paths", r.paths_size(), kMaxPathsPerWait); });
  for (int i = 0; s.ok() && i < r.paths_size(); ++i) s = ValidatePath(r.paths(i), Nth("paths", i));
  if (s.ok()) s = WaitTimeoutMs(r.timeout_s(), timeout_ms);
  return s;
}

Status CheckRequest(const v1::CommitTagRequest& r) {
  Status s = Session(r.session());
  return s.ok() ? CheckTag(r.tag(), "tag") : s;
}

Status CheckRequest(const v1::ListTagsRequest& r) {
  return First([&] { return Session(r.session()); }, [&] { return Job(r.job()); });
}

Status CheckRequest(const v1::SetRingRequest& r) {
  Status s = First([&] { return Session(r.session()); }, [&] { return Job(r.job()); },
                   [&] { return ValidateRank("node_rank", r.node_rank()); },
                   [&] { return Count("endpoints", r.endpoints_size(), kMaxRingNodes); });
  for (int i = 0; s.ok() && i < r.endpoints_size(); ++i)
    s = ValidateText(Nth("endpoints", i), r.endpoints(i), kMaxEndpointBytes, false);
  return s;
}

Status CheckRequest(const v1::PrefetchRequest& r) {
  Status s = First([&] { return Session(r.session()); }, [&] { return Job(r.job()); },
                   [&] { return Count("paths", r.paths_size(), kMaxPrefetchPaths); });
  if (s.ok() && !r.dir().empty()) s = ValidatePath(r.dir(), "dir");
  for (int i = 0; s.ok() && i < r.paths_size(); ++i) s = ValidatePath(r.paths(i), Nth("paths", i));
  if (s.ok() && r.dir().empty() && r.paths_size() == 0) s = Status::InvalidArgument("a prefetch names a dir or paths");
  return s;
}

}  // namespace tce
