// PutObject: a whole object, in one PUT or as a multipart upload whose parts
// several threads send at once.
#include <algorithm>
#include <system_error>
#include <thread>

#include "common/logging.h"
#include "common/mutex.h"
#include "storage/s3_client.h"
#include "storage/s3_xml.h"

namespace tce {
namespace {

// The parts of one multipart upload, handed out to the threads that send
// them; the first failure stops the handing out. Thread-safe.
class PartQueue {
 public:
  explicit PartQueue(size_t parts) : etags_(parts), checksums_(parts) {}

  // The next part to send (0-based); false once all are handed out or one failed.
  bool Next(size_t* part) EXCLUDES(mu_) {
    MutexLock lock(&mu_);
    if (!failure_.ok() || next_ == etags_.size()) return false;
    *part = next_++;
    return true;
  }
  void Done(size_t part, std::string etag, std::string checksum) EXCLUDES(mu_) {
    MutexLock lock(&mu_);
    etags_[part] = std::move(etag);
    checksums_[part] = std::move(checksum);
  }
  void Fail(Status s) EXCLUDES(mu_) {
    MutexLock lock(&mu_);
    if (failure_.ok()) failure_ = std::move(s);
  }
  // The first failure, or OK with every part's ETag (call once the senders are done).
  Status Finish(std::vector<std::string>* etags, std::vector<std::string>* checksums) EXCLUDES(mu_) {
    MutexLock lock(&mu_);
    if (!failure_.ok()) return failure_;
    *etags = std::move(etags_);
    *checksums = std::move(checksums_);
    return Status::OK();
  }

 private:
  Mutex mu_;
  size_t next_ GUARDED_BY(mu_) = 0;
  Status failure_ GUARDED_BY(mu_);
  std::vector<std::string> etags_ GUARDED_BY(mu_);
  std::vector<std::string> checksums_ GUARDED_BY(mu_);
};

struct Upload {
  S3Client* client;
  const std::string& bucket;
  const std::string& key;
  const std::string& upload_id;
  const char* data;
  uint64_t n;
  uint64_t part_size;
  const std::function<void(uint64_t)>& prepare;
};

// Sends parts until none is left (each UploadPart retries on its own).
void SendParts(const Upload& u, PartQueue* queue) {
  size_t part;
  while (queue->Next(&part)) {
    const uint64_t offset = part * u.part_size;
    const uint64_t len = std::min(u.part_size, u.n - offset);
    std::string etag, checksum;
    if (u.prepare) u.prepare(offset + len);
    Status s = u.client->UploadPart(u.bucket, u.key, u.upload_id, static_cast<int>(part + 1), u.data + offset, len,
                                    &etag, &checksum);
    if (s.ok()) {
      queue->Done(part, std::move(etag), std::move(checksum));
    } else {
      queue->Fail(std::move(s));
    }
  }
}

Status SendAllParts(const Upload& u, size_t parts, int parallel, std::vector<std::string>* etags,
                    std::vector<std::string>* checksums) {
  PartQueue queue(parts);
  std::vector<std::thread> threads;
  const size_t extra = std::min<size_t>(parts, static_cast<size_t>(std::max(parallel, 1))) - 1;
  for (size_t i = 0; i < extra; ++i) {
    try {
      threads.emplace_back(SendParts, std::cref(u), &queue);
    } catch (const std::system_error&) {  // out of threads: fewer parts in flight
      break;
    }
  }
  SendParts(u, &queue);
  for (auto& t : threads) t.join();
  return queue.Finish(etags, checksums);
}

}  // namespace

uint64_t S3PartSize(uint64_t n, uint64_t part_size) {
  if (part_size == 0 || n == 0 || (n - 1) / part_size + 1 <= 10000) return part_size;
  const uint64_t least = (n - 1) / 10000 + 1;  // bytes per part for 10000 parts
  return ((least - 1) / (1 << 20) + 1) << 20;
}

Status PutObject(S3Client* client, const std::string& bucket, const std::string& key, const char* data, uint64_t n,
                 const S3PutOptions& options, std::string* etag) {
  if (n <= options.part_size) {
    if (options.prepare) options.prepare(n);
    if (options.before_commit) {
      Status s = options.before_commit();
      if (!s.ok()) return s;
    }
    return client->Put(bucket, key, data, n, etag, options.metadata);
  }
  const uint64_t part_size = S3PartSize(n, options.part_size);
  const uint64_t parts = part_size == 0 ? 0 : (n - 1) / part_size + 1;
  if (parts == 0 || parts > 10000) {
    return Status::InvalidArgument("S3 upload of " + std::to_string(n) + " bytes in parts of " +
                                   std::to_string(part_size) + " needs more than 10000 parts");
  }
  std::string upload_id;
  if (options.journal) options.journal(UploadEvent::kCreating, "");
  Status s = client->CreateMultipart(bucket, key, &upload_id, options.metadata);
  if (!s.ok()) return s;
  if (options.journal) options.journal(UploadEvent::kCreated, upload_id);
  const Upload upload{client, bucket, key, upload_id, data, n, part_size, options.prepare};
  std::vector<std::string> etags, checksums;
  s = SendAllParts(upload, parts, options.parallel, &etags, &checksums);
  if (s.ok() && options.before_commit) s = options.before_commit();
  if (s.ok()) s = client->CompleteMultipart(bucket, key, upload_id, etags, etag, checksums);
  if (s.ok()) {
    if (options.journal) options.journal(UploadEvent::kEnded, upload_id);
    return s;
  }
  // Parts of an upload never completed are invisible, but S3 keeps (and
  // bills) them until it is aborted.
  Status aborted = client->AbortMultipart(bucket, key, upload_id);
  if (aborted.ok()) {
    if (options.journal) options.journal(UploadEvent::kEnded, upload_id);
  } else {
    TCE_LOG(kWarning, "s3") << "upload " << Printable(upload_id, 128) << " of " << Printable(key)
                            << " left unfinished (the journal keeps it): " << aborted.ToString();
  }
  return s;
}

}  // namespace tce
