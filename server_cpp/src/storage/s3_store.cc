#include "storage/s3_store.h"

#include <algorithm>
#include <cctype>
#include <atomic>
#include <system_error>
#include <thread>
#include <vector>

#include "common/logging.h"
#include "storage/s3_xml.h"

namespace tce {
namespace {

// How far the store's time a creation is journaled with may be off: one
// second of Date's resolution and of Initiated's, and some; without a Date
// seen yet, SigV4's own bound on a client's clock (15 minutes).
constexpr int64_t kKnownSlackS = 5;
constexpr int64_t kUnknownSlackS = 15 * 60;

// A bucket name as S3 allows it (3-63 of a-z 0-9 . -), so it can go into a
// host name or a path unescaped.
bool ValidBucket(const std::string& b) {
  if (b.size() < 3 || b.size() > 63) return false;
  for (char c : b)
    if (!((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '.' || c == '-')) return false;
  return b.front() != '.' && b.front() != '-' && b.back() != '.' && b.back() != '-';
}

// "bucket/a/b" -> bucket "bucket", prefix "a/b/".
Status SplitLocation(const std::string& location, std::string* bucket, std::string* prefix) {
  const size_t slash = location.find('/');
  *bucket = location.substr(0, slash);
  std::string p = slash == std::string::npos ? "" : location.substr(slash + 1);
  while (!p.empty() && p.back() == '/') p.pop_back();
  for (char c : p)
    if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f || c == '\\')
      return Status::InvalidArgument("the key prefix has a control character or '\\'");
  if (p.find("//") != std::string::npos || p == "." || p.find("./") == 0 || p.find("/./") != std::string::npos ||
      p.find("..") != std::string::npos)
    return Status::InvalidArgument("the key prefix has an empty, '.' or '..' component");
  *prefix = p.empty() ? "" : p + "/";
  if (!ValidBucket(*bucket))
    return Status::InvalidArgument("'" + *bucket + "' is not a bucket name (3-63 of a-z, 0-9, '.', '-')");
  return Status::OK();
}

}  // namespace

Status S3Store::CheckLocation(const std::string& location) {
  std::string bucket, prefix;
  return SplitLocation(location, &bucket, &prefix);
}

Status S3Store::Open(const std::string& location, const S3StoreOptions& options,
                     std::shared_ptr<ObjectStore>* out, std::string* prefix) {
  std::string bucket;
  if (Status s = SplitLocation(location, &bucket, prefix); !s.ok()) return s;
  S3StoreOptions o = options;
  if (!o.journal.empty()) {  // a file named after the URL: the same store finds it after a restart
    const std::string url = "s3://" + location;
    std::string name;
    for (char c : url) name += std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '.' ? c : '_';
    o.journal += "/uploads-" + name.substr(0, 200) + ".journal";
  }
  S3Config c;
  c.endpoint = options.endpoint;
  c.region = options.region;
  c.path_style = options.path_style;
  c.verify_tls = options.verify_tls;
  c.ca_file = options.ca_file;
  c.retries = options.retries;
  c.backoff = std::chrono::milliseconds(options.backoff_ms);
  c.request_timeout = std::chrono::milliseconds(options.request_timeout_ms);
  c.checksum = options.checksum;
  Status s = LoadS3Credentials(options.credentials_file, options.profile, &c.credentials);
  if (!s.ok()) return s;
  *out = std::make_shared<S3Store>(bucket, std::move(o), std::make_unique<S3Client>(std::move(c)));
  return Status::OK();
}

S3Store::S3Store(std::string bucket, S3StoreOptions options, std::unique_ptr<S3Client> client)
    : bucket_(std::move(bucket)),
      options_(std::move(options)),
      run_(UploadJournal::NewToken()),
      client_(std::move(client)),
      journal_(options_.journal) {}

void S3Store::Journal(const std::string& key, UploadEvent event, const std::string& upload_id, std::string* token) {
  switch (event) {
    case UploadEvent::kCreating: {
      int64_t now = 0;
      const bool known = client_->StoreTime(&now);
      *token = journal_.Creating(key, now, known ? kKnownSlackS : kUnknownSlackS);
      break;
    }
    case UploadEvent::kCreated:
      journal_.Created(*token, upload_id, key);
      break;
    case UploadEvent::kEnded:
      journal_.Ended(upload_id);
      break;
  }
}

bool S3Store::Abort(const std::string& key, const std::string& id, const char* how) {
  Status s = client_->AbortMultipart(bucket_, key, id);
  if (s.ok() || s.code() == Status::Code::kNotFound) {
    TCE_LOG(kInfo, "s3") << "aborted the unfinished upload of " << Url(key) << " a crash left (" << how << ")";
    return true;
  }
  TCE_LOG(kWarning, "s3") << "cannot abort the unfinished upload of " << Url(key) << ": " << s.ToString()
                          << " (tried again at the next start)";
  return false;
}

int S3Store::AbandonUnfinished() {
  UploadJournal::Open open;
  if (!journal_.Read(&open)) {
    if (open.read_bytes > 0) journal_.Rewrite(open, "");  // unreadable: started anew
    return 0;
  }
  int aborted = 0;
  std::string keep;  // what is left, for the next start
  for (const auto& [id, key] : open.uploads) {
    if (Abort(key, id, "journaled"))
      ++aborted;
    else
      keep += UploadJournal::UploadLine(id, key);
  }
  // Creations whose answer the crashed run never saw: their uploads are
  // those of the key that S3 says were initiated while the request could
  // have been in flight (from its journaling to its deadline), give or take
  // the time's slack, and before this start; this run's own are known.
  int64_t now = 0;
  const int64_t now_slack = client_->StoreTime(&now) ? kKnownSlackS : kUnknownSlackS;
  const int64_t in_flight_s = (options_.request_timeout_ms + 999) / 1000;
  for (const UploadJournal::Creation& c : open.creations) {
    std::vector<S3Upload> uploads;
    Status s = client_->ListUploads(bucket_, c.key, &uploads);
    if (!s.ok()) {
      TCE_LOG(kWarning, "s3") << "cannot list the uploads of " << Url(c.key) << ": " << s.ToString()
                              << " (tried again at the next start)";
      keep += UploadJournal::CreationLine(c);
      continue;
    }
    for (const S3Upload& u : uploads) {
      int64_t initiated = 0;
      if (u.key != c.key || open.uploads.count(u.upload_id) || journal_.CreatedHere(u.upload_id) ||
          !ParseIsoTime(u.initiated, &initiated) || initiated < c.at_s - c.slack_s ||
          initiated > c.at_s + in_flight_s + c.slack_s || initiated > now + now_slack)
        continue;  // another writer's (or this run's)
      if (Abort(c.key, u.upload_id, "its creation's answer never came"))
        ++aborted;
      else
        keep += UploadJournal::UploadLine(u.upload_id, c.key);
    }
  }
  journal_.Rewrite(open, keep);
  return aborted;
}

namespace {

// The owner and the write an object's HEAD (or GET) says.
void OwnerFrom(const S3Metadata& metadata, ObjectId* out) {
  auto it = metadata.find(kOwnerMetadata);
  out->owned = it != metadata.end();
  out->owner = out->owned ? ParseOwner(it->second) : 0;
  it = metadata.find(kWriteMetadata);
  out->written_by = it != metadata.end() ? it->second : "";
}

// Runs fn(0..n-1) on up to `width` threads; the first failure stops the rest.
Status ForEach(size_t n, int width, const std::function<Status(size_t)>& fn) {
  std::atomic<size_t> next{0};
  std::atomic<bool> failed{false};
  Mutex mu;
  Status first;
  auto run = [&] {
    for (size_t i; !failed.load() && (i = next.fetch_add(1)) < n;) {
      Status s = fn(i);
      if (!s.ok() && !failed.exchange(true)) {
        MutexLock l(&mu);
        first = s;
      }
    }
  };
  std::vector<std::thread> threads;
  const size_t extra = std::min<size_t>(static_cast<size_t>(std::max(1, width)), n);
  for (size_t t = 1; t < extra; ++t) {
    try {
      threads.emplace_back(run);
    } catch (const std::system_error&) {
      break;  // out of threads: fewer in flight
    }
  }
  run();
  for (auto& t : threads) t.join();
  MutexLock l(&mu);
  return first;
}

}  // namespace

Status S3Store::Write(const std::string& key, const char* data, uint64_t n, const WriteOptions& options,
                      FileStat* out) {
  S3PutOptions po;
  po.part_size = options_.part_size;
  po.parallel = options_.parallel;
  const bool saver_known = options.uid != kNoUid;
  if (saver_known) po.metadata[kOwnerMetadata] = std::to_string(options.uid);
  const std::string marker = options.write_id.empty() ? "" : run_ + "." + options.write_id;
  if (!marker.empty()) po.metadata[kWriteMetadata] = marker;
  std::string token;  // this upload's creation in the journal
  po.journal = [this, &key, &token](UploadEvent event, const std::string& id) { Journal(key, event, id, &token); };
  // CANCELLED is coherence's verdict (the caller's check refused the write);
  // the client's own CANCELLED only means the server is stopping.
  bool refused = false;
  po.prepare = options.prepare;
  // The last look: the caller's, then the key must hold no other owner's
  // object and still hold what the save found (no lock is held across the
  // commit: S3 has no rename to order against; a save of the same key
  // meanwhile writes its own version after this one).
  // An earlier attempt of this very write may have landed (its answer
  // lost, or cut off at the deadline): the key then holds its marker, and
  // the write is done.
  ObjectId landed;
  po.before_commit = [&]() {
    Status c = options.before_commit ? options.before_commit() : Status::OK();
    const bool compare = options.expected && options.expected->known;
    if (c.ok() && (compare || saver_known || !marker.empty())) {
      ObjectId now;
      Status st = Stat(key, &now);
      if (!st.ok()) {
        c = Status::Unavailable("cannot check " + Url(key) + " before writing it: " + st.message());
      } else if (!marker.empty() && now.exists && now.written_by == marker && now.size == n) {
        landed = now;
        return Status::FromCode(Status::Code::kAlreadyExists, Url(key) + " holds this write already");
      } else if (Status may = MayUse({options.uid, options.uid == 0 || !saver_known}, now, Url(key), "replace");
                 !may.ok()) {
        c = may;
      } else if (StorageCheck k = compare ? CompareObject(Url(key), *options.expected, now) : StorageCheck();
                 k.verdict == Verdict::kChanged) {
        c = Status::Cancelled(k.why);
      }
    }
    refused = !c.ok();
    return c;
  };
  std::string etag;
  Status s = PutObject(client_.get(), bucket_, key, data, n, po, &etag);
  if (landed.exists) {
    TCE_LOG(kInfo, "s3") << Url(key) << " was written by an earlier attempt whose answer was lost";
    s = Status::OK();
    etag = landed.etag;
  }
  if (s.code() == Status::Code::kCancelled && !refused)
    return Status::Unavailable("the upload of " + Url(key) + " was stopped: the server is stopping");
  if (!s.ok()) return s;
  *out = FileStat();
  out->size = n;
  out->etag = etag;
  out->mode = 0100644;
  return Status::OK();
}

Status S3Store::CheckKey(const std::string& key) const {
  if (key.size() <= kS3MaxKey) return Status::OK();
  return Status::InvalidArgument("its object key would be " + std::to_string(key.size()) + " bytes, longer than the " +
                                 std::to_string(kS3MaxKey) + " S3 allows (" + Url(key.substr(0, 64)) +
                                 "...): S3 cannot hold it");
}

bool S3Store::Retryable(const Status& s) const {
  // The client retried throttling, 5xx and timeouts itself; a refusal
  // (403, a bad request) will not clear by waiting; a request that ran to
  // its deadline met an endpoint that does not answer: trying again at once
  // would hold this root's workers as long again, so the file is FAILED and
  // persisted again after persist_failed_retry_ms.
  return s.code() != Status::Code::kPermissionDenied && s.code() != Status::Code::kInvalidArgument &&
         s.code() != Status::Code::kDeadlineExceeded;
}

Status S3Store::Read(const std::string& key, uint64_t offset, uint64_t n, char* into, const std::string& etag,
                     const Requester& who) {
  // Each answer's metadata names the owner of the object its bytes come
  // from: checked before any of them is written into `into`.
  const std::string url = Url(key);
  const S3Client::Admit admit = [&who, &url](const S3Metadata& metadata) {
    ObjectId o;
    o.exists = true;
    OwnerFrom(metadata, &o);
    return MayUse(who, o, url, "read");
  };
  const uint64_t piece = std::max<uint64_t>(options_.range_size, 1 << 20);
  const uint64_t pieces = (n + piece - 1) / piece;
  if (pieces <= 1) return n == 0 ? Status::OK() : client_->GetRange(bucket_, key, offset, n, into, etag, admit);
  return ForEach(pieces, options_.parallel, [&](size_t i) {
    const uint64_t at = i * piece, len = std::min(piece, n - at);
    return client_->GetRange(bucket_, key, offset + at, len, into + at, etag, admit);
  });
}

Status S3Store::Stat(const std::string& key, ObjectId* out) {
  S3Object o;
  Status s = client_->Head(bucket_, key, &o);
  if (!s.ok()) return s;
  out->exists = o.exists;
  out->size = o.size;
  out->etag = o.etag;
  OwnerFrom(o.metadata, out);
  return Status::OK();
}

Status S3Store::List(const std::string& prefix, const Requester& who, std::vector<ListedObject>* out) {
  out->clear();
  std::vector<S3Listed> listed;
  Status s = client_->List(bucket_, prefix, &listed);
  if (!s.ok()) return s;
  // A listing carries no metadata: each object's owner takes a look.
  std::vector<char> keep(listed.size(), who.admin ? 1 : 0);
  if (!who.admin) {
    s = ForEach(listed.size(), options_.parallel, [&](size_t i) {
      ObjectId o;
      Status st = Stat(listed[i].key, &o);
      if (st.ok()) keep[i] = o.exists && MayUse(who, o, Url(listed[i].key), "list").ok();  // gone meanwhile: left out
      return st;
    });
    if (!s.ok()) return s;
  }
  for (size_t i = 0; i < listed.size(); ++i)
    if (keep[i]) out->push_back({listed[i].key, listed[i].size});
  return Status::OK();
}

Status S3Store::Delete(const std::string& key, const Requester& who) {
  if (!who.admin) {
    // (The look and the delete are two requests: an object written by its
    // owner between them is deleted all the same.)
    ObjectId o;
    Status s = Stat(key, &o);
    if (s.ok()) s = MayUse(who, o, Url(key), "delete");
    if (!s.ok()) return s;
  }
  return client_->Delete(bucket_, key);
}

}  // namespace tce
