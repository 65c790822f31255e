// S3Http: one HTTP exchange with S3 over libcurl, for S3Client (which adds
// the retries and reads the answer). It keeps a pool of curl handles, one per
// exchange in flight, each with the connections it opened kept alive for the
// next exchange; Cancel ends every exchange and backoff sleep at once.
// Thread-safe.
//
// Requests are signed by curl (CURLOPT_AWS_SIGV4), which signs the URL's
// path and query exactly as written: callers build them with S3UriEncode and
// S3Query, already in SigV4's canonical form.
#pragma once

#include <atomic>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "common/clock.h"
#include "common/mutex.h"
#include "common/status.h"
#include "storage/s3_client.h"

struct curl_slist;

namespace tce {

// `s` URI-encoded as SigV4 wants it: unreserved characters (A-Z a-z 0-9
// - . _ ~) kept, '/' kept where `keep_slash`, everything else %XX (upper case).
std::string S3UriEncode(std::string_view s, bool keep_slash);
// A canonical query string: names and values encoded, sorted by name, each
// with its `=` (curl 7.88 signs the query as written, without sorting it).
std::string S3Query(std::vector<std::pair<std::string, std::string>> params);

// The most an XML (or error) body may hold: S3's largest, a 1000-entry
// listing page, is a few hundred KiB.
constexpr size_t kS3MaxBody = 16 << 20;

struct S3HttpReply;

struct S3HttpRequest {
  const char* method = "GET";  // GET HEAD PUT POST DELETE
  std::string url;
  // "Name: value", each signed by curl along with host and x-amz-date. Never
  // "Name:" (which removes a header curl adds): curl 7.88 signs it all the
  // same, and S3 refuses a signature over a header it did not receive.
  std::vector<std::string> headers;
  const char* body = nullptr;        // PUT and POST: the request body
  size_t body_size = 0;
  // A 2xx GET's body goes here, exactly `sink_size` bytes; anything else
  // goes to the reply's `body`.
  char* sink = nullptr;
  uint64_t sink_size = 0;
  // Asked once a 2xx GET's headers are in, before its first byte goes to
  // `sink`: false ends the exchange with nothing written there (Perform
  // answers ABORTED). Optional.
  std::function<bool(const S3HttpReply&)> admit_sink;
};

// The most user-metadata headers (x-amz-meta-*) a reply keeps: S3 allows
// 2 KiB of them in all.
constexpr size_t kS3MaxMetadata = 32;

struct S3HttpReply {
  long status = 0;
  std::string body;  // at most kS3MaxBody
  std::string etag, content_length, content_range, date;  // those headers, raw (empty when absent)
  // x-amz-meta-NAME headers: NAME in lower case, the value raw (at most
  // kS3MaxMetadata of them; a name twice keeps the first).
  S3Metadata metadata;
  uint64_t sink_bytes = 0;  // bytes written to the request's sink
};

struct S3Transfer;  // one exchange's state, for curl's callbacks (s3_http.cc)

class S3Http {
 public:
  explicit S3Http(const S3Config& config);
  ~S3Http();
  S3Http(const S3Http&) = delete;
  S3Http& operator=(const S3Http&) = delete;

  // Sends `req` once. OK with `reply` filled when an HTTP response came
  // (whatever its status); UNAVAILABLE for a failure a retry may cure (no
  // connection, a timeout, a reset, a truncated body); CANCELLED after
  // Cancel; ABORTED when `admit_sink` refused the body; DEADLINE_EXCEEDED once the config's clock reaches `deadline`
  // (the exchange is cut off, whatever it was doing); INTERNAL when the
  // server sent more than the sink or kS3MaxBody holds; INVALID_ARGUMENT
  // for what curl refuses to send.
  Status Perform(const S3HttpRequest& req, S3HttpReply* reply, Clock::TimePoint deadline) EXCLUDES(mu_);
  // Sleeps `d` on the config's clock; false when Cancel ended it (or came before).
  bool Sleep(Clock::Duration d) EXCLUDES(mu_);
  void Cancel() EXCLUDES(mu_);
  bool cancelled() const { return cancelled_.load(); }

 private:
  struct Handle;  // a curl easy handle and the multi handle it runs on
  using Transfer = S3Transfer;
  Handle* Acquire() EXCLUDES(mu_);
  void Release(Handle* h) EXCLUDES(mu_);
  Status Configure(Handle* h, Transfer* t);
  enum class Driven { kFinished, kCancelled, kDeadline };
  // Runs the configured transfer to its end, Cancel or the deadline.
  Driven Drive(Handle* h, Clock::TimePoint deadline, int* result);
  Status Outcome(int result, const Transfer& t) const;

  const S3Config& config_;
  curl_slist* resolve_ = nullptr;  // CURLOPT_RESOLVE, read at every transfer
  std::atomic<bool> cancelled_{false};
  Mutex mu_;
  CondVar cancel_cv_;  // signalled by Cancel, for Sleep
  std::vector<std::unique_ptr<Handle>> handles_ GUARDED_BY(mu_);  // every handle made
  std::vector<Handle*> idle_ GUARDED_BY(mu_);
};

// S3Client's request and reply (s3_client.cc, s3_upload.cc).
struct S3Client::Request {
  Request(const char* method, std::string url, std::string what_arg) : what(std::move(what_arg)) {
    http.method = method;
    http.url = std::move(url);
  }
  S3HttpRequest http;
  std::string what;  // "S3 PUT bucket/key": how error messages begin
  bool xml = false;  // a 2xx body is an XML document, which may be an <Error>
};
struct S3Client::Reply : S3HttpReply {};

// "S3 <method> bucket/key" for messages, the key made printable.
std::string S3What(const char* method, const std::string& bucket, const std::string& key);

}  // namespace tce
