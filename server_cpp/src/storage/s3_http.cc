#include "storage/s3_http.h"

#include <curl/curl.h>
#include <strings.h>

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <cstring>
#include <mutex>

#include "storage/s3_xml.h"

namespace tce {

std::string S3UriEncode(std::string_view s, bool keep_slash) {
  static const char kHex[] = "0123456789ABCDEF";
  std::string out;
  out.reserve(s.size());
  for (unsigned char c : s) {
    const bool unreserved = (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-' ||
                            c == '.' || c == '_' || c == '~';
    if (unreserved || (keep_slash && c == '/')) {
      out += static_cast<char>(c);
    } else {
      out += '%';
      out += kHex[c >> 4];
      out += kHex[c & 15];
    }
  }
  return out;
}

std::string S3Query(std::vector<std::pair<std::string, std::string>> params) {
  for (auto& p : params) {
    p.first = S3UriEncode(p.first, false);
    p.second = S3UriEncode(p.second, false);
  }
  std::sort(params.begin(), params.end());
  std::string out;
  for (const auto& p : params) {
    if (!out.empty()) out += '&';
    out += p.first + "=" + p.second;
  }
  return out;
}

struct S3Http::Handle {
  CURL* easy = nullptr;
  CURLM* multi = nullptr;
};

struct S3Transfer {
  const S3HttpRequest* req;
  S3HttpReply* reply;
  CURL* easy;
  curl_slist* headers = nullptr;
  size_t read_pos = 0;      // of the request body
  int to_sink = -1;         // whether the response body goes to the sink; -1 until it starts
  bool overflow = false;    // the server sent more than the sink or kS3MaxBody holds
  bool refused = false;     // admit_sink said no
  char error[CURL_ERROR_SIZE] = {};
};

namespace {

std::once_flag g_curl_init;

std::string_view Trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t' || s.back() == '\r' || s.back() == '\n')) {
    s.remove_suffix(1);
  }
  return s;
}

bool NameIs(std::string_view name, const char* want) {
  return name.size() == std::strlen(want) && strncasecmp(name.data(), want, name.size()) == 0;
}

// Header values are kept only as far as any valid one reaches, so a hostile
// header costs little and still fails the strict parsing later.
constexpr size_t kMaxHeaderValue = 1024;
constexpr std::string_view kMetaPrefix = "x-amz-meta-";

}  // namespace

extern "C" {

static size_t S3OnHeader(char* data, size_t size, size_t n, void* user) {
  auto* t = static_cast<S3Transfer*>(user);
  const size_t total = size * n;
  const std::string_view line(data, total);
  S3HttpReply* reply = t->reply;
  if (line.compare(0, 5, "HTTP/") == 0) {  // a new response (after a 100 Continue, say)
    reply->etag.clear();
    reply->content_length.clear();
    reply->content_range.clear();
    reply->date.clear();
    reply->metadata.clear();
    return total;
  }
  const size_t colon = line.find(':');
  if (colon == std::string_view::npos) return total;
  const std::string_view name = Trim(line.substr(0, colon));
  const std::string_view value = Trim(line.substr(colon + 1)).substr(0, kMaxHeaderValue + 1);
  if (NameIs(name, "etag")) {
    reply->etag.assign(value.data(), value.size());
  } else if (NameIs(name, "content-length")) {
    reply->content_length.assign(value.data(), value.size());
  } else if (NameIs(name, "content-range")) {
    reply->content_range.assign(value.data(), value.size());
  } else if (NameIs(name, "date")) {
    reply->date.assign(value.data(), value.size());
  } else if (name.size() > kMetaPrefix.size() &&
             strncasecmp(name.data(), kMetaPrefix.data(), kMetaPrefix.size()) == 0 &&
             reply->metadata.size() < kS3MaxMetadata) {
    std::string meta(name.substr(kMetaPrefix.size()));
    for (char& c : meta) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    if (reply->metadata.find(meta) == reply->metadata.end()) reply->metadata.emplace(meta, std::string(value));
  }
  return total;
}

static size_t S3OnWrite(char* data, size_t size, size_t n, void* user) {
  auto* t = static_cast<S3Transfer*>(user);
  const size_t total = size * n;
  if (t->to_sink < 0) {
    long code = 0;
    curl_easy_getinfo(t->easy, CURLINFO_RESPONSE_CODE, &code);
    t->to_sink = t->req->sink != nullptr && code >= 200 && code < 300;
    if (t->to_sink && t->req->admit_sink && !t->req->admit_sink(*t->reply)) {
      t->refused = true;
      return 0;  // ends the transfer: nothing reaches the sink
    }
  }
  S3HttpReply* reply = t->reply;
  if (t->to_sink) {
    if (total > t->req->sink_size - reply->sink_bytes) {
      t->overflow = true;
      return 0;  // ends the transfer: nothing is written past the sink
    }
    std::memcpy(t->req->sink + reply->sink_bytes, data, total);
    reply->sink_bytes += total;
    return total;
  }
  if (total > kS3MaxBody - reply->body.size()) {
    t->overflow = true;
    return 0;
  }
  reply->body.append(data, total);
  return total;
}

static size_t S3OnRead(char* buffer, size_t size, size_t n, void* user) {
  auto* t = static_cast<S3Transfer*>(user);
  const size_t k = std::min(size * n, t->req->body_size - t->read_pos);
  std::memcpy(buffer, t->req->body + t->read_pos, k);
  t->read_pos += k;
  return k;
}

// curl rewinds the body when it sends the request again on a new
// connection (a kept-alive one the server had closed).
static int S3OnSeek(void* user, curl_off_t offset, int origin) {
  auto* t = static_cast<S3Transfer*>(user);
  if (origin != SEEK_SET || offset < 0 || static_cast<uint64_t>(offset) > t->req->body_size) {
    return CURL_SEEKFUNC_CANTSEEK;
  }
  t->read_pos = static_cast<size_t>(offset);
  return CURL_SEEKFUNC_OK;
}

}  // extern "C"

S3Http::S3Http(const S3Config& config) : config_(config) {
  std::call_once(g_curl_init, [] { curl_global_init(CURL_GLOBAL_DEFAULT); });
  for (const std::string& entry : config_.resolve) resolve_ = curl_slist_append(resolve_, entry.c_str());
}

S3Http::~S3Http() {
  MutexLock lock(&mu_);
  for (auto& h : handles_) {
    curl_multi_cleanup(h->multi);
    curl_easy_cleanup(h->easy);
  }
  curl_slist_free_all(resolve_);
}

S3Http::Handle* S3Http::Acquire() {
  MutexLock lock(&mu_);
  if (!idle_.empty()) {
    Handle* h = idle_.back();
    idle_.pop_back();
    return h;
  }
  auto h = std::make_unique<Handle>();
  h->easy = curl_easy_init();
  h->multi = curl_multi_init();
  if (h->easy == nullptr || h->multi == nullptr) {
    if (h->easy) curl_easy_cleanup(h->easy);
    if (h->multi) curl_multi_cleanup(h->multi);
    return nullptr;
  }
  handles_.push_back(std::move(h));
  return handles_.back().get();
}

void S3Http::Release(Handle* h) {
  MutexLock lock(&mu_);
  idle_.push_back(h);
}

Status S3Http::Configure(Handle* h, Transfer* t) {
  CURL* e = h->easy;
  const S3HttpRequest& req = *t->req;
  // A reset handle keeps its connections (they live in its multi handle),
  // so each exchange starts from curl's defaults yet reuses them.
  curl_easy_reset(e);
  const long stall_s = std::max<long>(1, static_cast<long>((config_.stall_timeout.count() + 999) / 1000));
  bool ok = curl_easy_setopt(e, CURLOPT_URL, req.url.c_str()) == CURLE_OK;
  ok &= curl_easy_setopt(e, CURLOPT_NOSIGNAL, 1L) == CURLE_OK;
  ok &= curl_easy_setopt(e, CURLOPT_PROTOCOLS_STR, "http,https") == CURLE_OK;
  ok &= curl_easy_setopt(e, CURLOPT_PATH_AS_IS, 1L) == CURLE_OK;  // a key's "/../" is a name, not a path step
  ok &= curl_easy_setopt(e, CURLOPT_HTTP_VERSION, static_cast<long>(CURL_HTTP_VERSION_1_1)) == CURLE_OK;
  ok &= curl_easy_setopt(e, CURLOPT_CONNECTTIMEOUT_MS, static_cast<long>(config_.connect_timeout.count())) ==
        CURLE_OK;
  ok &= curl_easy_setopt(e, CURLOPT_LOW_SPEED_LIMIT, 1L) == CURLE_OK;
  ok &= curl_easy_setopt(e, CURLOPT_LOW_SPEED_TIME, stall_s) == CURLE_OK;
  ok &= curl_easy_setopt(e, CURLOPT_TCP_KEEPALIVE, 1L) == CURLE_OK;
  ok &= curl_easy_setopt(e, CURLOPT_BUFFERSIZE, 512L << 10) == CURLE_OK;
  ok &= curl_easy_setopt(e, CURLOPT_UPLOAD_BUFFERSIZE, 512L << 10) == CURLE_OK;
  ok &= curl_easy_setopt(e, CURLOPT_SSL_VERIFYPEER, config_.verify_tls ? 1L : 0L) == CURLE_OK;
  ok &= curl_easy_setopt(e, CURLOPT_SSL_VERIFYHOST, config_.verify_tls ? 2L : 0L) == CURLE_OK;
  if (!config_.ca_file.empty()) ok &= curl_easy_setopt(e, CURLOPT_CAINFO, config_.ca_file.c_str()) == CURLE_OK;
  if (resolve_ != nullptr) ok &= curl_easy_setopt(e, CURLOPT_RESOLVE, resolve_) == CURLE_OK;
  ok &= curl_easy_setopt(e, CURLOPT_ERRORBUFFER, t->error) == CURLE_OK;
  ok &= curl_easy_setopt(e, CURLOPT_HEADERFUNCTION, S3OnHeader) == CURLE_OK;
  ok &= curl_easy_setopt(e, CURLOPT_HEADERDATA, t) == CURLE_OK;
  ok &= curl_easy_setopt(e, CURLOPT_WRITEFUNCTION, S3OnWrite) == CURLE_OK;
  ok &= curl_easy_setopt(e, CURLOPT_WRITEDATA, t) == CURLE_OK;
  const S3Credentials& cred = config_.credentials;
  if (!cred.access_key.empty()) {
    const std::string sigv4 = "aws:amz:" + config_.region + ":s3";
    ok &= curl_easy_setopt(e, CURLOPT_AWS_SIGV4, sigv4.c_str()) == CURLE_OK;
    ok &= curl_easy_setopt(e, CURLOPT_USERNAME, cred.access_key.c_str()) == CURLE_OK;
    ok &= curl_easy_setopt(e, CURLOPT_PASSWORD, cred.secret_key.c_str()) == CURLE_OK;
  }
  const std::string method = req.method;
  if (method == "HEAD") {
    ok &= curl_easy_setopt(e, CURLOPT_NOBODY, 1L) == CURLE_OK;
  } else if (method == "PUT") {
    ok &= curl_easy_setopt(e, CURLOPT_UPLOAD, 1L) == CURLE_OK;
    ok &= curl_easy_setopt(e, CURLOPT_READFUNCTION, S3OnRead) == CURLE_OK;
    ok &= curl_easy_setopt(e, CURLOPT_READDATA, t) == CURLE_OK;
    ok &= curl_easy_setopt(e, CURLOPT_SEEKFUNCTION, S3OnSeek) == CURLE_OK;
    ok &= curl_easy_setopt(e, CURLOPT_SEEKDATA, t) == CURLE_OK;
    ok &= curl_easy_setopt(e, CURLOPT_INFILESIZE_LARGE, static_cast<curl_off_t>(req.body_size)) == CURLE_OK;
  } else if (method == "POST") {
    ok &= curl_easy_setopt(e, CURLOPT_POST, 1L) == CURLE_OK;
    ok &= curl_easy_setopt(e, CURLOPT_POSTFIELDS, req.body != nullptr ? req.body : "") == CURLE_OK;
    ok &= curl_easy_setopt(e, CURLOPT_POSTFIELDSIZE_LARGE, static_cast<curl_off_t>(req.body_size)) == CURLE_OK;
  } else if (method != "GET") {
    ok &= curl_easy_setopt(e, CURLOPT_CUSTOMREQUEST, req.method) == CURLE_OK;
  }
  // Before a body over 1 MiB curl sends "Expect: 100-continue" and waits
  // for the server's go-ahead; this sends the body at once. (Removing the
  // header with an empty "Expect:" will not do: curl 7.88 signs the empty
  // header it does not send, and S3 refuses the signature.)
  ok &= curl_easy_setopt(e, CURLOPT_EXPECT_100_TIMEOUT_MS, 0L) == CURLE_OK;
  for (const std::string& header : req.headers) t->headers = curl_slist_append(t->headers, header.c_str());
  if (t->headers != nullptr) ok &= curl_easy_setopt(e, CURLOPT_HTTPHEADER, t->headers) == CURLE_OK;
  if (!ok) return Status::Internal("S3: libcurl refused an option (7.85 or newer is needed)");
  return Status::OK();
}

S3Http::Driven S3Http::Drive(Handle* h, Clock::TimePoint deadline, int* result) {
  if (curl_multi_add_handle(h->multi, h->easy) != CURLM_OK) {
    *result = CURLE_FAILED_INIT;
    return Driven::kFinished;
  }
  Driven how = Driven::kCancelled;
  while (!cancelled_.load()) {
    int running = 0;
    if (curl_multi_perform(h->multi, &running) != CURLM_OK) {
      *result = CURLE_FAILED_INIT;
      how = Driven::kFinished;
      break;
    }
    if (running == 0) {
      int left = 0;
      CURLMsg* msg = curl_multi_info_read(h->multi, &left);
      *result = msg != nullptr && msg->msg == CURLMSG_DONE ? msg->data.result : CURLE_FAILED_INIT;
      how = Driven::kFinished;
      break;
    }
    if (cancelled_.load()) break;
    // The deadline is the config's clock's (a test moves it), so it is
    // looked at here rather than left to curl's own timers.
    const std::chrono::milliseconds left = config_.clock->Left(deadline);
    if (left.count() == 0) {
      how = Driven::kDeadline;
      break;
    }
    // Woken early by the socket, or by Cancel (curl_multi_wakeup); the
    // timeout only bounds curl's own timers and the look at the deadline.
    curl_multi_poll(h->multi, nullptr, 0, static_cast<int>(std::min<int64_t>(1000, left.count())), nullptr);
  }
  // Removed mid-transfer, the connection is closed, not kept.
  curl_multi_remove_handle(h->multi, h->easy);
  return how;
}

Status S3Http::Outcome(int result, const Transfer& t) const {
  const auto code = static_cast<CURLcode>(result);
  if (code == CURLE_OK) return Status::OK();
  if (t.refused) return Status::Aborted("the answer was refused before its body");
  if (t.overflow) {
    return Status::Internal(t.req->sink != nullptr && t.to_sink == 1
                                ? "S3 sent more than the " + std::to_string(t.req->sink_size) + " bytes asked for"
                                : "S3 sent a response body over " + std::to_string(kS3MaxBody) + " bytes");
  }
  std::string what = curl_easy_strerror(code);
  if (t.error[0] != '\0') what += ": " + Printable(t.error);
  switch (code) {
    case CURLE_UNSUPPORTED_PROTOCOL:
    case CURLE_URL_MALFORMAT:
    case CURLE_NOT_BUILT_IN:
    case CURLE_BAD_FUNCTION_ARGUMENT:
    case CURLE_SETOPT_OPTION_SYNTAX:  // a malformed `resolve` entry
    case CURLE_SSL_CACERT_BADFILE:
    case CURLE_SSL_CERTPROBLEM:
      return Status::InvalidArgument("S3: " + what);
    case CURLE_PEER_FAILED_VERIFICATION:  // a retry meets the same certificate
      return Status::FailedPrecondition("S3: " + what);
    case CURLE_OUT_OF_MEMORY:
      return Status::ResourceExhausted("S3: " + what);
    default:  // no connection, a timeout or a stall, a reset, a cut-off body
      return Status::Unavailable(what);
  }
}

Status S3Http::Perform(const S3HttpRequest& req, S3HttpReply* reply, Clock::TimePoint deadline) {
  if (cancelled_.load()) return Status::Cancelled("S3 client cancelled");
  Handle* h = Acquire();
  if (h == nullptr) return Status::ResourceExhausted("S3: cannot create a curl handle");
  Transfer t;
  t.req = &req;
  t.reply = reply;
  t.easy = h->easy;
  Status s = Configure(h, &t);
  int result = CURLE_OK;
  if (s.ok()) {
    switch (Drive(h, deadline, &result)) {
      case Driven::kFinished:
        s = Outcome(result, t);
        break;
      case Driven::kCancelled:
        s = Status::Cancelled("S3 client cancelled");
        break;
      case Driven::kDeadline:
        s = Status::DeadlineExceeded("cut off at the request's deadline");
        break;
    }
  }
  if (s.ok()) curl_easy_getinfo(h->easy, CURLINFO_RESPONSE_CODE, &reply->status);
  curl_slist_free_all(t.headers);
  Release(h);
  return s;
}

bool S3Http::Sleep(Clock::Duration d) {
  Clock* clock = config_.clock;
  const Clock::TimePoint deadline = clock->Now() + d;
  MutexLock lock(&mu_);
  while (!cancelled_.load() && clock->Now() < deadline) clock->WaitUntil(&cancel_cv_, &mu_, deadline);
  return !cancelled_.load();
}

void S3Http::Cancel() {
  cancelled_.store(true);
  MutexLock lock(&mu_);
  for (auto& h : handles_) curl_multi_wakeup(h->multi);
  cancel_cv_.SignalAll();
}

}  // namespace tce
