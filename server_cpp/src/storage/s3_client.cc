#include "storage/s3_client.h"

#include <algorithm>
#include <random>

#include "common/logging.h"
#include "storage/s3_http.h"
#include "storage/s3_xml.h"

namespace tce {
namespace {

// SHA-256 of the empty string: the payload hash of a request without a body.
constexpr char kEmptySha256[] = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855";
// More pages than this is a listing that does not end (a billion keys).
constexpr int kMaxPages = 1 << 20;
// Entries one page may hold: S3 sends at most 1000.
constexpr size_t kMaxPageEntries = 10000;

bool HasControl(const std::string& s) {
  return std::any_of(s.begin(), s.end(), [](char c) { return static_cast<unsigned char>(c) < 0x20 || c == 0x7f; });
}

bool IsIpLiteral(const std::string& host) {
  if (!host.empty() && host[0] == '[') return true;
  const std::string name = host.substr(0, host.find(':'));
  return !name.empty() && name.find_first_not_of("0123456789.") == std::string::npos;
}

bool Retryable(long status, const std::string& code) {
  return status == 429 || status == 500 || status == 502 || status == 503 || status == 504 || code == "SlowDown" ||
         code == "InternalError" || code == "RequestTimeout" || code == "ServiceUnavailable" ||
         code == "BadDigest";  // the body was damaged on its way (Content-MD5)
}

// The Status an HTTP response means for `req`: OK for success, the error
// otherwise; for a failure a retry may cure, OK with `failure` saying what
// it was.
Status Judge(const std::string& what, bool xml, const S3HttpReply& reply, std::string* failure) {
  const long st = reply.status;
  const bool success = st >= 200 && st < 300;
  const bool error_doc = !reply.body.empty() && XmlRoot(reply.body) == "Error";
  if (success && !(xml && error_doc)) return Status::OK();
  std::string code, message;
  if (error_doc) {
    if (!XmlField(reply.body, "Code", &code)) code.clear();
    if (!XmlField(reply.body, "Message", &message)) message.clear();
  }
  std::string desc = "HTTP " + std::to_string(st);
  if (!code.empty()) desc += " " + Printable(code, 64);
  if (!message.empty()) desc += ": " + Printable(message);
  if (Retryable(st, code)) {
    *failure = desc;
    return Status::OK();
  }
  std::string full = what + ": " + desc;
  if (st == 404 || code == "NoSuchKey" || code == "NoSuchUpload" || code == "NoSuchBucket") {
    return Status::NotFound(std::move(full));
  }
  if (st == 403 || code == "AccessDenied") return Status::PermissionDenied(std::move(full));
  if (st == 412 || code == "PreconditionFailed") return Status::FailedPrecondition(std::move(full));
  if (st == 501) return Status::NotSupported(std::move(full));
  if (success || (st >= 300 && st < 500)) return Status::InvalidArgument(std::move(full));
  return Status::Internal(std::move(full));
}

}  // namespace

std::string S3What(const char* method, const std::string& bucket, const std::string& key) {
  return std::string("S3 ") + method + " " + Printable(bucket, 64) + "/" + Printable(key);
}

S3Client::S3Client(S3Config config) : config_(std::move(config)) {
  const S3Credentials& cred = config_.credentials;
  std::string endpoint = config_.endpoint.empty() ? "https://s3." + config_.region + ".amazonaws.com" : config_.endpoint;
  const size_t sep = endpoint.find("://");
  if (sep != std::string::npos) {
    scheme_ = endpoint.substr(0, sep);
    host_ = endpoint.substr(sep + 3);
  }
  if (!host_.empty() && host_.back() == '/') host_.pop_back();
  if (config_.region.empty() || config_.region.find_first_not_of("abcdefghijklmnopqrstuvwxyz0123456789-") !=
                                    std::string::npos) {
    config_error_ = Status::InvalidArgument("S3 region '" + Printable(config_.region, 64) + "' is not a region name");
  } else if ((scheme_ != "http" && scheme_ != "https") || host_.empty() ||
             host_.find_first_of("/?#@ \t\r\n") != std::string::npos || HasControl(host_)) {
    config_error_ = Status::InvalidArgument("S3 endpoint '" + Printable(endpoint, 128) +
                                            "' is not http(s)://host[:port]");
  } else if (!config_.path_style && IsIpLiteral(host_)) {
    config_error_ = Status::InvalidArgument("S3 endpoint " + Printable(endpoint, 128) +
                                            " is an address: virtual-hosted buckets need a host name (path style)");
  } else if (HasControl(cred.access_key) || HasControl(cred.secret_key) || HasControl(cred.session_token)) {
    config_error_ = Status::InvalidArgument("S3 credentials hold control characters");
  } else if (!cred.access_key.empty() && cred.secret_key.empty()) {
    config_error_ = Status::InvalidArgument("S3 credentials have an access key but no secret key");
  } else if (config_.retries < 0 || config_.backoff.count() < 0 || config_.max_backoff.count() < 0 ||
             config_.connect_timeout.count() <= 0 || config_.stall_timeout.count() <= 0 ||
             config_.request_timeout.count() <= 0 || config_.clock == nullptr) {
    config_error_ = Status::InvalidArgument("S3 retries, backoff and timeouts must not be negative");
  }
  http_ = std::make_unique<S3Http>(config_);
}

S3Client::~S3Client() = default;

void S3Client::Cancel() { http_->Cancel(); }

uint64_t S3Client::retries_made() const { return retries_made_.load(); }

namespace {
int64_t WallSeconds(Clock* clock) {
  return std::chrono::duration_cast<std::chrono::seconds>(clock->WallNow().time_since_epoch()).count();
}
}  // namespace

bool S3Client::StoreTime(int64_t* unix_s) const {
  *unix_s = WallSeconds(config_.clock) + store_time_offset_s_.load();
  return store_time_known_.load();
}

Status S3Client::Check(const std::string& bucket, const std::string* key) const {
  if (!config_error_.ok()) return config_error_;
  // Virtual-hosted, the bucket is part of a host name.
  const char* allowed = config_.path_style ? "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789.-_"
                                           : "abcdefghijklmnopqrstuvwxyz0123456789.-";
  if (bucket.empty() || bucket.size() > 255 || bucket.find_first_not_of(allowed) != std::string::npos ||
      bucket.front() == '.' || bucket.back() == '.') {
    return Status::InvalidArgument("S3 bucket name '" + Printable(bucket, 64) + "' is not valid");
  }
  if (key != nullptr && (key->empty() || key->size() > kS3MaxKey)) {
    return Status::InvalidArgument("S3 key must be 1 to " + std::to_string(kS3MaxKey) + " bytes: '" +
                                   Printable(*key) + "'");
  }
  return Status::OK();
}

std::string S3Client::Url(const std::string& bucket, const std::string& key, const std::string& query) const {
  std::string url = scheme_ + "://";
  if (config_.path_style) {
    url += host_ + "/" + bucket;
    if (!key.empty()) url += "/" + S3UriEncode(key, true);
  } else {
    url += bucket + "." + host_ + "/" + S3UriEncode(key, true);
  }
  if (!query.empty()) url += "?" + query;
  return url;
}

std::string S3Client::Redact(std::string message) const {
  // Nothing puts them in a message on purpose; a server echoing a header
  // back (the token travels in one, the access key id in Authorization's
  // Credential) must not leak them either.
  const S3Credentials& cred = config_.credentials;
  for (const std::string* secret : {&cred.access_key, &cred.secret_key, &cred.session_token}) {
    if (secret->size() < 8) continue;
    for (size_t at = message.find(*secret); at != std::string::npos; at = message.find(*secret, at)) {
      message.replace(at, secret->size(), "<redacted>");
    }
  }
  return message;
}

Status S3Client::Redacted(const Status& s) const {
  return s.ok() ? s : Status::FromCode(s.code(), Redact(s.message()));
}

std::chrono::milliseconds S3Client::Backoff(int attempt) const {
  const int64_t max = config_.max_backoff.count();
  int64_t cap = std::min(config_.backoff.count(), max);
  for (int i = 0; i < attempt && cap < max; ++i) cap = cap > max / 2 ? max : cap * 2;
  if (cap <= 0) return std::chrono::milliseconds(0);
  thread_local std::mt19937_64 rng(std::random_device{}());
  return std::chrono::milliseconds(std::uniform_int_distribution<int64_t>(0, cap)(rng));
}

Status S3Client::Run(Request* req, Reply* reply) {
  const S3Credentials& cred = config_.credentials;
  Clock* clock = config_.clock;
  const Clock::TimePoint deadline = clock->Now() + config_.request_timeout;
  std::string failure;  // the last attempt's, when it may clear
  auto too_late = [&] {
    return Status::DeadlineExceeded(
        Redact(req->what + ": not done within " + std::to_string(config_.request_timeout.count()) +
               " ms (s3_request_timeout_ms)" + (failure.empty() ? "" : "; the last attempt: " + failure)));
  };
  for (int attempt = 0;; ++attempt) {
    S3HttpRequest http = req->http;
    // curl 7.88 signs this header's value as the payload hash.
    http.headers.push_back(std::string("x-amz-content-sha256: ") +
                           (http.body_size > 0 ? "UNSIGNED-PAYLOAD" : kEmptySha256));
    if (config_.amz_date) http.headers.push_back("x-amz-date: " + config_.amz_date());
    if (!cred.session_token.empty()) http.headers.push_back("x-amz-security-token: " + cred.session_token);
    *reply = Reply();
    Status s = http_->Perform(http, reply, deadline);
    if (s.code() == Status::Code::kDeadlineExceeded) return too_late();
    if (int64_t date = 0; s.ok() && ParseHttpDate(reply->date, &date)) {
      store_time_offset_s_.store(date - WallSeconds(clock));
      store_time_known_.store(true);
    }
    failure.clear();
    if (s.ok()) {
      s = Judge(req->what, req->xml, *reply, &failure);
    } else if (s.code() == Status::Code::kUnavailable) {
      failure = s.message();
    } else if (s.code() != Status::Code::kCancelled) {
      s = Status::FromCode(s.code(), req->what + ": " + s.message());
    }
    if (failure.empty()) return Status::FromCode(s.code(), Redact(s.message()));
    if (attempt >= config_.retries) {
      return Status::Unavailable(Redact(req->what + ": " + failure + " (after " + std::to_string(attempt) +
                                        " retries)"));
    }
    retries_made_.fetch_add(1);
    TCE_LOG(kDebug, "s3") << "retrying " << Redact(req->what + " after " + failure);
    const Clock::Duration pause = std::min<Clock::Duration>(Backoff(attempt), deadline - clock->Now());
    if (!http_->Sleep(pause)) return Status::Cancelled(req->what + ": S3 client cancelled");
    if (clock->Now() >= deadline) return too_late();
  }
}

Status S3Client::Head(const std::string& bucket, const std::string& key, S3Object* out) {
  *out = S3Object();
  Status s = Check(bucket, &key);
  if (!s.ok()) return s;
  Request req("HEAD", Url(bucket, key, ""), S3What("HEAD", bucket, key));
  Reply reply;
  s = Run(&req, &reply);
  if (s.code() == Status::Code::kNotFound) return Status::OK();
  if (!s.ok()) return s;
  if (!ParseDecimal(reply.content_length, &out->size)) {
    return Redacted(Status::Internal(req.what + ": bad Content-Length '" + Printable(reply.content_length, 32) + "'"));
  }
  if (!CleanEtag(reply.etag, &out->etag)) {
    return Redacted(Status::Internal(req.what + ": bad ETag '" + Printable(reply.etag, 64) + "'"));
  }
  out->metadata = std::move(reply.metadata);
  out->exists = true;
  return Status::OK();
}

namespace {

// Whether Content-Range `value` ("bytes A-B/T", T maybe "*") names bytes
// [first, last]; `*total` is T (0 when unknown).
bool RangeIs(const std::string& value, uint64_t first, uint64_t last, uint64_t* total) {
  *total = 0;
  const std::string prefix = "bytes ";
  const size_t dash = value.find('-'), slash = value.find('/');
  if (value.compare(0, prefix.size(), prefix) != 0 || dash == std::string::npos || slash == std::string::npos ||
      slash < dash) {
    return false;
  }
  uint64_t a, b;
  const std::string t = value.substr(slash + 1);
  if (t != "*" && !ParseDecimal(t, total)) return false;
  return ParseDecimal(value.substr(prefix.size(), dash - prefix.size()), &a) &&
         ParseDecimal(value.substr(dash + 1, slash - dash - 1), &b) && a == first && b == last;
}

}  // namespace

Status S3Client::GetRange(const std::string& bucket, const std::string& key, uint64_t offset, uint64_t n,
                          char* into, const std::string& if_match, const Admit& admit) {
  Status s = Check(bucket, &key);
  if (!s.ok() || n == 0) return s;  // HTTP has no empty range
  const uint64_t last = offset + n - 1;
  if (last < offset) return Status::InvalidArgument(S3What("GET", bucket, key) + ": range past 2^64");
  Request req("GET", Url(bucket, key, ""), S3What("GET", bucket, key));
  req.http.headers.push_back("Range: bytes=" + std::to_string(offset) + "-" + std::to_string(last));
  if (!if_match.empty()) {
    std::string etag;
    if (!CleanEtag(if_match, &etag)) return Status::InvalidArgument(req.what + ": if_match is not an ETag");
    req.http.headers.push_back("If-Match: \"" + etag + "\"");
  }
  req.http.sink = into;
  req.http.sink_size = n;
  Status refused;
  if (admit) {
    req.http.admit_sink = [&](const S3HttpReply& r) {
      refused = admit(r.metadata);
      return refused.ok();
    };
  }
  Reply reply;
  s = Run(&req, &reply);
  if (!refused.ok()) return refused;
  if (!s.ok()) return s;
  const std::string range = "[" + std::to_string(offset) + ", " + std::to_string(offset + n) + ")";
  uint64_t total = 0, length = 0;
  if (reply.status == 206 && !RangeIs(reply.content_range, offset, last, &total)) {
    if (total != 0 && total < offset + n) {
      return Status::FromCode(Status::Code::kOutOfRange, req.what + ": asked for " + range + " of an object of " +
                                                             std::to_string(total) + " bytes");
    }
    return Redacted(Status::Internal(req.what + ": asked for " + range + ", got Content-Range '" +
                                     Printable(reply.content_range, 64) + "'"));
  }
  // A server that ignores Range answers 200 with the whole object: right
  // only when that is the range asked for.
  if (reply.status != 206 && !(offset == 0 && ParseDecimal(reply.content_length, &length) && length == n)) {
    return Status::Internal(req.what + ": HTTP " + std::to_string(reply.status) + " is not the range " + range);
  }
  if (reply.sink_bytes != n) {
    return Status::Internal(req.what + ": got " + std::to_string(reply.sink_bytes) + " of the " +
                            std::to_string(n) + " bytes of " + range);
  }
  return Status::OK();
}

Status S3Client::Delete(const std::string& bucket, const std::string& key) {
  Status s = Check(bucket, &key);
  if (!s.ok()) return s;
  Request req("DELETE", Url(bucket, key, ""), S3What("DELETE", bucket, key));
  Reply reply;
  s = Run(&req, &reply);
  return s.code() == Status::Code::kNotFound ? Status::OK() : s;
}

Status S3Client::ListPage(const std::string& bucket, const std::string& query, std::string* body) {
  Request req("GET", Url(bucket, "", query), S3What("GET", bucket, "?" + query));
  req.xml = true;
  Reply reply;
  Status s = Run(&req, &reply);
  *body = std::move(reply.body);
  return s;
}

Status S3Client::List(const std::string& bucket, const std::string& prefix, std::vector<S3Listed>* out) {
  out->clear();
  Status s = Check(bucket, nullptr);
  if (!s.ok()) return s;
  std::string token, body, truncated;
  std::vector<std::string_view> entries;
  for (int page = 0; page < kMaxPages; ++page) {
    std::vector<std::pair<std::string, std::string>> params = {{"list-type", "2"}, {"prefix", prefix}};
    if (!token.empty()) params.emplace_back("continuation-token", token);
    s = ListPage(bucket, S3Query(std::move(params)), &body);
    if (!s.ok()) return s;
    const std::string what = S3What("GET", bucket, "?list-type=2") + " page " + std::to_string(page);
    if (!XmlElements(body, "Contents", kMaxPageEntries, &entries)) {
      return Status::Internal(what + ": malformed or oversized listing");
    }
    for (std::string_view entry : entries) {
      S3Listed listed;
      std::string size, etag;
      if (!XmlField(entry, "Key", &listed.key) || !XmlField(entry, "Size", &size) ||
          !ParseDecimal(size, &listed.size) || !XmlField(entry, "ETag", &etag) || !CleanEtag(etag, &listed.etag)) {
        return Redacted(Status::Internal(what + ": malformed entry '" + Printable(entry, 128) + "'"));
      }
      out->push_back(std::move(listed));
    }
    if (!XmlField(body, "IsTruncated", &truncated) || truncated != "true") return Status::OK();
    std::string next;
    if (!XmlField(body, "NextContinuationToken", &next) || next.empty() || next == token || HasControl(next)) {
      return Status::Internal(what + ": truncated listing without a new continuation token");
    }
    token = std::move(next);
  }
  return Status::Internal(S3What("GET", bucket, prefix) + ": listing did not end after " +
                          std::to_string(kMaxPages) + " pages");
}

Status S3Client::ListUploads(const std::string& bucket, const std::string& prefix, std::vector<S3Upload>* out) {
  out->clear();
  Status s = Check(bucket, nullptr);
  if (!s.ok()) return s;
  std::string key_marker, id_marker, body, truncated;
  std::vector<std::string_view> entries;
  for (int page = 0; page < kMaxPages; ++page) {
    std::vector<std::pair<std::string, std::string>> params = {{"uploads", ""}, {"prefix", prefix}};
    if (!key_marker.empty()) params.emplace_back("key-marker", key_marker);
    if (!id_marker.empty()) params.emplace_back("upload-id-marker", id_marker);
    s = ListPage(bucket, S3Query(std::move(params)), &body);
    if (!s.ok()) return s;
    const std::string what = S3What("GET", bucket, "?uploads") + " page " + std::to_string(page);
    if (!XmlElements(body, "Upload", kMaxPageEntries, &entries)) {
      return Status::Internal(what + ": malformed or oversized listing");
    }
    for (std::string_view entry : entries) {
      S3Upload upload;
      if (!XmlField(entry, "Key", &upload.key) || !XmlField(entry, "UploadId", &upload.upload_id) ||
          upload.upload_id.empty() || HasControl(upload.upload_id)) {
        return Redacted(Status::Internal(what + ": malformed entry '" + Printable(entry, 128) + "'"));
      }
      if (!XmlField(entry, "Initiated", &upload.initiated)) upload.initiated.clear();
      upload.initiated = Printable(upload.initiated, 64);
      out->push_back(std::move(upload));
    }
    if (!XmlField(body, "IsTruncated", &truncated) || truncated != "true") return Status::OK();
    std::string next_key, next_id;
    if (!XmlField(body, "NextKeyMarker", &next_key) || !XmlField(body, "NextUploadIdMarker", &next_id) ||
        (next_key == key_marker && next_id == id_marker) || HasControl(next_key) || HasControl(next_id)) {
      return Status::Internal(what + ": truncated listing without new markers");
    }
    key_marker = std::move(next_key);
    id_marker = std::move(next_id);
  }
  return Status::Internal(S3What("GET", bucket, prefix) + ": listing did not end after " +
                          std::to_string(kMaxPages) + " pages");
}

}  // namespace tce
