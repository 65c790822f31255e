// S3Client: the S3 REST calls the server stores checkpoints with, over
// libcurl, signed with AWS Signature Version 4 (curl's CURLOPT_AWS_SIGV4).
// Each call retries what S3 says may pass (throttling, 5xx, dropped
// connections) with jittered exponential backoff, and maps the rest onto
// Status codes. Every method may be called from any thread at once: each
// call runs on a curl handle of its own from a pool, which keeps its
// connections alive for the next call.
//
// Credentials never appear in a log line or an error message.
#pragma once

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "common/clock.h"
#include "common/status.h"

namespace tce {

// The longest key S3 takes, in bytes (of its UTF-8).
constexpr size_t kS3MaxKey = 1024;

struct S3Credentials {
  std::string access_key, secret_key, session_token;
};
// Environment (AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_SESSION_TOKEN)
// when `file` is empty, else the AWS shared-credentials INI file (`[profile]`
// sections, aws_access_key_id, aws_secret_access_key, aws_session_token;
// at most 64 KiB). An empty `profile` is "default". NOT_FOUND when there
// are no credentials there; INVALID_ARGUMENT when they are incomplete or hold
// control characters. Errors never contain the secret.
Status LoadS3Credentials(const std::string& file, const std::string& profile, S3Credentials* out);

struct S3Config {
  std::string endpoint;  // "http://127.0.0.1:9000" or "https://s3.us-east-1.amazonaws.com"; empty: https://s3.<region>.amazonaws.com
  std::string region = "us-east-1";
  bool path_style = false;  // true: endpoint/bucket/key; false: bucket.host/key (virtual-hosted)
  bool verify_tls = true;
  std::string ca_file;  // empty: system CAs
  S3Credentials credentials;  // empty access_key: unsigned (anonymous) requests
  int retries = 8;            // attempts after the first, for retryable failures
  std::chrono::milliseconds backoff{100};  // full jitter: sleep uniform(0, min(max_backoff, backoff * 2^attempt))
  std::chrono::milliseconds max_backoff{20000};
  std::chrono::milliseconds connect_timeout{10000};
  std::chrono::milliseconds stall_timeout{30000};  // a transfer with no progress this long fails, then is retried
  // The most one call may take, its retries and their backoff included: at
  // it the exchange in flight is cut off and the call fails with
  // DEADLINE_EXCEEDED (measured on `clock`).
  std::chrono::milliseconds request_timeout{120000};
  std::vector<std::string> resolve;  // CURLOPT_RESOLVE entries "host:port:addr" (pin an endpoint's address)
  // How the store checks each body it receives: "crc32" (x-amz-checksum-crc32
  // on every PUT and part, the upload created with that algorithm), "md5"
  // (Content-MD5), or "none".
  std::string checksum = "crc32";
  // Tests only: when set, requests carry this x-amz-date (e.g. "20130524T000000Z") instead of curl's clock.
  std::function<std::string()> amz_date;
  Clock* clock = Clock::Real();  // backoff sleeps are measured on it
};

// An object's user metadata (x-amz-meta-NAME: value), NAME in lower case.
using S3Metadata = std::map<std::string, std::string>;

struct S3Object {
  bool exists = false;
  uint64_t size = 0;
  std::string etag;  // without quotes
  S3Metadata metadata;  // as the store sent it: hostile until checked
};
struct S3Listed {
  std::string key;
  uint64_t size = 0;
  std::string etag;
};
struct S3Upload {
  std::string key, upload_id;
  std::string initiated;  // ISO-8601 as S3 gives it
};

class S3Http;

class S3Client {
 public:
  // A config the client cannot use (a malformed endpoint, credentials with
  // control characters) makes every call fail with INVALID_ARGUMENT.
  explicit S3Client(S3Config config);
  ~S3Client();
  S3Client(const S3Client&) = delete;
  S3Client& operator=(const S3Client&) = delete;

  // Every call: retried on transport errors (connect, timeouts, resets), HTTP
  // 500/502/503/504/429 and the S3 error codes SlowDown, InternalError,
  // RequestTimeout, ServiceUnavailable (also when a 200 response body is an
  // <Error>, as CompleteMultipartUpload can answer), with jittered
  // exponential backoff, all within the config's request_timeout. Errors:
  // 404/NoSuchKey/NoSuchUpload -> NOT_FOUND; 403 -> PERMISSION_DENIED; 412
  // -> FAILED_PRECONDITION; retries exhausted -> UNAVAILABLE naming the last
  // failure; request_timeout reached -> DEADLINE_EXCEEDED naming it and the
  // last failure; other 4xx -> INVALID_ARGUMENT with S3's Code and Message
  // (bounded, control characters escaped); a malformed response -> INTERNAL.

  // Absent: OK with exists=false.
  Status Head(const std::string& bucket, const std::string& key, S3Object* out);
  // Reads [offset, offset+n) into `into`: exactly n bytes or an error; more
  // or fewer bytes from the server is an error, never a write past `into`.
  // `if_match` non-empty: If-Match header (a replaced object ->
  // FAILED_PRECONDITION). `admit` (optional) is shown the metadata of the
  // object the bytes come from before the first of them is written: a
  // non-OK status ends the read with it, nothing written to `into`.
  using Admit = std::function<Status(const S3Metadata&)>;
  Status GetRange(const std::string& bucket, const std::string& key, uint64_t offset, uint64_t n, char* into,
                  const std::string& if_match = "", const Admit& admit = nullptr);
  // `metadata`: the new object's user metadata (names of a-z, 0-9 and '-',
  // values of printable ASCII; INVALID_ARGUMENT otherwise). A multipart
  // upload's is given when it is created.
  Status Put(const std::string& bucket, const std::string& key, const char* data, size_t n, std::string* etag,
             const S3Metadata& metadata = {});
  Status CreateMultipart(const std::string& bucket, const std::string& key, std::string* upload_id,
                         const S3Metadata& metadata = {});
  // `checksum` (optional): the part's checksum as sent (crc32: base64), for CompleteMultipart.
  Status UploadPart(const std::string& bucket, const std::string& key, const std::string& upload_id, int part_number,
                    const char* data, size_t n, std::string* etag, std::string* checksum = nullptr);
  // Parts 1..N in order. Finding the upload gone (an earlier attempt whose
  // reply was lost may have completed it), it compares the object's ETag
  // with the one these parts make, so a lost reply is not a failure.
  // `part_checksums`: UploadPart's, in part order (empty: none sent).
  Status CompleteMultipart(const std::string& bucket, const std::string& key, const std::string& upload_id,
                           const std::vector<std::string>& part_etags, std::string* etag,
                           const std::vector<std::string>& part_checksums = {});
  // Absent: OK.
  Status AbortMultipart(const std::string& bucket, const std::string& key, const std::string& upload_id);
  // Unfinished multipart uploads under `prefix`, all pages.
  Status ListUploads(const std::string& bucket, const std::string& prefix, std::vector<S3Upload>* out);
  // ListObjectsV2 under `prefix`, all pages.
  Status List(const std::string& bucket, const std::string& prefix, std::vector<S3Listed>* out);
  // Absent: OK.
  Status Delete(const std::string& bucket, const std::string& key);

  // Makes every wait and transfer in progress end at once with CANCELLED,
  // and every call after it too: a call begun just after Cancel would
  // otherwise run its timeouts and retries in full (shutdown waits on it).
  void Cancel();
  // Retried requests so far (for Status/metrics).
  uint64_t retries_made() const;
  // The store's time now, in seconds since the Unix epoch: the config's
  // clock's wall time, corrected by how far the Date of the store's last
  // answer was from it. False (and the clock's own time) before any answer
  // carried a Date.
  bool StoreTime(int64_t* unix_s) const;
  const S3Config& config() const { return config_; }

 private:
  struct Request;
  struct Reply;
  // One request, with its retries.
  Status Run(Request* req, Reply* reply);
  // The config's error, or INVALID_ARGUMENT for a bucket (or key, unless
  // null) S3 would refuse or that would change the request's meaning.
  Status Check(const std::string& bucket, const std::string* key) const;
  std::string Url(const std::string& bucket, const std::string& key, const std::string& query) const;
  // `message` with the access key id, secret key and session token blotted out.
  std::string Redact(std::string message) const;
  // `s` with its message redacted (every error that quotes what S3 sent).
  Status Redacted(const Status& s) const;
  std::chrono::milliseconds Backoff(int attempt) const;
  Status ListPage(const std::string& bucket, const std::string& query, std::string* body);
  // The body's checksum header (config_.checksum); `checksum` gets a crc32's value.
  void AddChecksum(const char* data, size_t n, std::vector<std::string>* headers, std::string* checksum) const;
  // x-amz-meta-* headers for `metadata`, or INVALID_ARGUMENT naming what S3 would not keep as given.
  static Status AddMetadata(const std::string& what, const S3Metadata& metadata, std::vector<std::string>* headers);

  const S3Config config_;
  Status config_error_;
  std::string scheme_, host_;  // from the endpoint: "https", "s3.us-east-1.amazonaws.com[:port]"
  std::unique_ptr<S3Http> http_;
  std::atomic<uint64_t> retries_made_{0};
  std::atomic<bool> store_time_known_{false};
  std::atomic<int64_t> store_time_offset_s_{0};  // the store's Date minus the clock's wall time
};

enum class UploadEvent { kCreating, kCreated, kEnded };

struct S3PutOptions {
  uint64_t part_size = 16 << 20;  // multipart above this size; S3's minimum part is 5 MiB
  int parallel = 8;               // parts in flight
  S3Metadata metadata;            // the object's user metadata
  // Called just before CreateMultipart (kCreating, no id yet: an upload
  // may exist from then on, its answer not yet seen), right after it with
  // the upload id (kCreated), and once it is completed or aborted (kEnded),
  // so the caller can journal unfinished uploads and abort them after a
  // crash. A failed CreateMultipart is followed by nothing: whether it
  // created an upload is unknown.
  std::function<void(UploadEvent event, const std::string& upload_id)> journal;
  // Called just before CompleteMultipart (or the single Put): a non-OK
  // status aborts the upload and is returned (the caller's last check that
  // the object may still be written).
  std::function<Status()> before_commit;
  // Called (from the sending thread) before the bytes below `end` are first
  // sent: the caller may finish them then (the persister patches the zip's
  // CRCs in place as it goes), overlapping that with the parts in flight.
  // Calls may come from several threads at once; `end` only grows per thread.
  std::function<void(uint64_t end)> prepare;
};
// Writes data[0, n) to bucket/key: one Put up to part_size, else a multipart
// upload with `parallel` parts in flight (threads; each part retried on its
// own), completed only when every part succeeded; on any failure or Cancel
// the upload is aborted (best effort: after Cancel the abort is not sent,
// and the journal keeps the upload) and nothing is visible at the key.
// `etag`: the new object's.
// The part size a multipart upload of `n` bytes uses: `part_size`, or for a
// file over S3's 10000 parts of it, parts just large enough (whole MiB).
uint64_t S3PartSize(uint64_t n, uint64_t part_size);
Status PutObject(S3Client* client, const std::string& bucket, const std::string& key, const char* data, uint64_t n,
                 const S3PutOptions& options, std::string* etag);

}  // namespace tce
