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

#include <memory>
#include <string>

#include "storage/object_store.h"
#include "storage/s3_client.h"
#include "storage/s3_journal.h"

namespace tce {

class S3Store : public ObjectStore {
 public:
  // Loads the credentials (options.credentials_file, else the environment).
  static Status Open(const std::string& bucket, const ObjectStoreOptions& options,
                     std::shared_ptr<ObjectStore>* out);

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

  S3Store(std::string bucket, ObjectStoreOptions options, std::unique_ptr<S3Client> client);

 private:
  // PutObject's journal events for `key`; `token` names its creation.
  void Journal(const std::string& key, UploadEvent event, const std::string& upload_id, std::string* token);
  // Aborts a crashed run's upload (`how` it was found, for the log); false when it stays.
  bool Abort(const std::string& key, const std::string& id, const char* how);

  const std::string bucket_;
  const ObjectStoreOptions options_;
  const std::string run_;  // random, per store: what a write's marker (tce-write) starts with
  const std::unique_ptr<S3Client> client_;
  UploadJournal journal_;
};

}  // namespace tce
