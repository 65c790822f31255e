// The boundary check of every control RPC: each string field (UTF-8, no NUL,
// length limits from common/validate.h) and each number (ranks, counts,
// timeouts) of a request, checked once before the handler touches it. The
// request is untrusted: it comes from any local process that can reach the
// socket. A refusal is INVALID_ARGUMENT naming the field ("path: contains
// NUL", "tag.files[3].path: ..."). Pure functions; any thread.
#pragma once

#include <string>

#include "common/status.h"
#include "tce/v1/tce.pb.h"

namespace tce {

Status CheckRequest(const v1::AllocateRequest& r);
Status CheckRequest(const v1::CommitRequest& r);
Status CheckRequest(const v1::AbortRequest& r);
Status CheckRequest(const v1::LookupRequest& r);
Status CheckRequest(const v1::ReadRangeRequest& r);  // the path; the range is the reader's to check
Status CheckRequest(const v1::ReleaseRequest& r);
Status CheckRequest(const v1::RemoveRequest& r);
Status CheckRequest(const v1::ListRequest& r);
// Also yields the timeout in ms (0: no limit; see WaitTimeoutMs).
Status CheckRequest(const v1::WaitRequest& r, int64_t* timeout_ms);
Status CheckRequest(const v1::CommitTagRequest& r);
Status CheckRequest(const v1::ListTagsRequest& r);
Status CheckRequest(const v1::SetRingRequest& r);
Status CheckRequest(const v1::PrefetchRequest& r);
constexpr int kMaxPrefetchPaths = 10000;
Status CheckRequest(const v1::StatusRequest& r);
Status CheckRequest(const v1::RetryRequest& r);
// Also yield the wait / lease asked for in ms (0: none asked; see SecondsMs).
Status CheckRequest(const v1::GetVersionRequest& r, int64_t* wait_ms);
Status CheckRequest(const v1::AcquireVersionRequest& r, int64_t* lease_ms);
Status CheckRequest(const v1::RenewVersionRequest& r, int64_t* lease_ms);
Status CheckRequest(const v1::ReleaseVersionRequest& r);
Status CheckRequest(const v1::GrantReadRequest& r);
Status CheckRequest(const v1::FollowRequest& r);

}  // namespace tce
