// S3Store: an ObjectStore over one S3 bucket (storage/s3_client.h). Large
// objects go up as multipart uploads with parts in parallel and come down
// as parallel ranged GETs. Every multipart upload is journaled
// (storage/s3_journal.h: its creation before it is sent, its id once
// answered, its end), so a restart aborts the uploads a crashed run of this
// server left, those whose creation it never saw answered included (found
// by key and initiation time), never another writer's. Every object it writes
// records its saver's uid, and reads, listings, deletes and writes are
// refused on another owner's object (storage/object_owner.h).
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "storage/object_store.h"
#include "storage/s3_client.h"
#include "storage/s3_journal.h"

namespace tce {

// The s3_* settings (daemon/settings.cc).
struct S3StoreOptions {
  std::string endpoint, region = "us-east-1", ca_file, credentials_file, profile = "default";
  bool path_style = false, verify_tls = true;
  uint64_t part_size = 8 << 20;    // multipart above this, in parts this size
  uint64_t range_size = 32 << 20;  // ranged reads of this size
  int parallel = 10, retries = 8;
  int backoff_ms = 100;
  int request_timeout_ms = 120000;  // one request, its retries included
  std::string checksum = "crc32";  // what the store checks each body with: crc32, md5 or none
  // Where unfinished uploads are journaled, so a restart abandons them:
  // for Open, a directory (each store journals in a file named after its
  // URL there); for the constructor, that file. Empty: not journaled.
  std::string journal;
};

class S3Store : public ObjectStore {
 public:
  // `location`: "BUCKET[/PREFIX]" (an s3:// URL's rest): a bucket name as
  // S3 allows it, a prefix of non-empty components, none '.' or '..'.
  static Status CheckLocation(const std::string& location);
  // Loads the credentials (options.credentials_file, else the environment);
  // `prefix` gets the location's key prefix ("" or ending in '/').
  static Status Open(const std::string& location, const S3StoreOptions& options,
                     std::shared_ptr<ObjectStore>* out, std::string* prefix);

  std::string Url(const std::string& key) const override { return "s3://" + bucket_ + "/" + key; }
  Status CheckKey(const std::string& key) const override;
  Status Write(const std::string& key, const char* data, uint64_t n, const WriteOptions& options,
               FileStat* out) override;
  bool Retryable(const Status& s) const override;
  Status Read(const std::string& key, uint64_t offset, uint64_t n, char* into, const std::string& etag,
              const Requester& who) override;
  Status Stat(const std::string& key, ObjectId* out) override;
  // Not for an administrator: each listed object is looked at (HeadObject,
  // `parallel` at a time) for its owner.
  Status List(const std::string& prefix, const Requester& who, std::vector<ListedObject>* out) override;
  Status Delete(const std::string& key, const Requester& who) override;
  int AbandonUnfinished() override;
  void Cancel() override { client_->Cancel(); }
  uint64_t retries() const override { return client_->retries_made(); }

  S3Store(std::string bucket, S3StoreOptions options, std::unique_ptr<S3Client> client);

 private:
  // PutObject's journal events for `key`; `token` names its creation.
  void Journal(const std::string& key, UploadEvent event, const std::string& upload_id, std::string* token);
  // Aborts a crashed run's upload (`how` it was found, for the log); false when it stays.
  bool Abort(const std::string& key, const std::string& id, const char* how);

  const std::string bucket_;
  const S3StoreOptions options_;
  const std::string run_;  // random, per store: what a write's marker (tce-write) starts with
  const std::unique_ptr<S3Client> client_;
  UploadJournal journal_;
};

}  // namespace tce
