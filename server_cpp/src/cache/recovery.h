// Recovery: the cache's side of what the ring brings back and of what
// peers read of this node (docs/architecture.md). It serves the replicator
// and the peer port through RecoveryStore, checks what a recovered copy and
// tag say that needs no state (valid names under the storage roots; which
// files a tag names that storage must answer for), and keeps what is
// recovery's own: the buffers reserved for recovered files and not yet
// adopted or abandoned, the files recovered and the copies refused as not
// matching metadata.
//
// The file table, the buffers, the budget and storage's checks are the
// Cache's, asked through RecoveryHost, each host call one step under the
// Cache's lock (an adoption's checks against the file table and its
// install are one step, so a save of the path never falls between them).
//
// Locks: its own `mu_` is a leaf: the Cache calls Figures() with its lock
// held, and Recovery never holds `mu_` while it calls the host. Order: the
// Cache's lock, then Recovery's. Thread-safe.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "cache/buffer.h"
#include "cache/cache_types.h"
#include "cache/recovery_store.h"
#include "common/mutex.h"
#include "common/status.h"
#include "storage/identity.h"
#include "storage/storage_roots.h"

namespace tce {

// What Recovery asks of the node's cache. Each call takes the cache's lock
// (CheckStorage and ProbePath ask storage, outside it); none holds
// Recovery's lock.
class RecoveryHost {
 public:
  virtual ~RecoveryHost() = default;
  // A new buffer of `size` bytes, counted against the budget (as reserved)
  // until Adopt or Unreserve; RESOURCE_EXHAUSTED when nothing evictable
  // makes room.
  virtual Status Reserve(uint64_t size, std::unique_ptr<Buffer>* out) = 0;
  // A reserved buffer given back: its bytes leave the budget.
  virtual void Unreserve(std::unique_ptr<Buffer> mem) = 0;
  // What storage holds at the copy's path now, against what the copy says
  // storage held (*here: what the path holds). Storage calls, no lock.
  virtual StorageCheck CheckStorage(const FileInfo& f, DiskIdentity* here) = 0;
  // RecoveryStore::AdoptRecovered's checks against what this server knows,
  // and the install, as one step; the reservation ends either way.
  virtual Status Adopt(FileInfo f, std::unique_ptr<Buffer> mem, const StorageCheck& storage,
                       const DiskIdentity& here) = 0;
  // RecoveryStore::AdoptTags (the tags are of `job`).
  virtual size_t AdoptTags(const std::string& job, std::vector<TagInfo> tags) = 0;
  // The indexes of the tag's files not in memory here at the tag's size.
  virtual std::vector<size_t> NotHeld(const TagInfo& tag) = 0;
  // What a directory root holds at `path` (*status, *now), asked on the
  // storage prober; false when storage does not answer in time. No lock.
  virtual bool ProbePath(const std::string& path, Status* status, DiskIdentity* now) = 0;
  // RecoveryStore::NotInMemory, InMemoryCount, StartPeerRead, EndPeerRead.
  virtual std::vector<FileInfo> NotInMemory(const std::string& job) = 0;
  virtual size_t InMemoryCount(const std::string& job) = 0;
  virtual Status PinForPeer(const std::string& job, const std::string& path, FileInfo* out, int* fd) = 0;
  virtual void Unpin(uint64_t buffer_id) = 0;
};

// Recovery's figures for CacheStats (and tests).
struct RecoveryFigures {
  uint64_t recovered_files = 0, mismatches = 0;  // since start
  uint64_t reserved_buffers = 0, reserved_bytes = 0;  // reserved now, not yet adopted or abandoned
};

class Recovery : public RecoveryStore {
 public:
  // `storage` names the roots a recovered path must be under; it and `host`
  // outlive it.
  Recovery(const StorageRoots* storage, RecoveryHost* host);
  Recovery(const Recovery&) = delete;
  Recovery& operator=(const Recovery&) = delete;

  // ---- RecoveryStore (cache/recovery_store.h) ----
  Status ReserveRecovery(uint64_t size, std::unique_ptr<Buffer>* out) override EXCLUDES(mu_);
  Status AdoptRecovered(FileInfo f, std::unique_ptr<Buffer> mem) override EXCLUDES(mu_);
  void AbandonRecovery(std::unique_ptr<Buffer> mem) override EXCLUDES(mu_);
  size_t AdoptTags(const std::string& job, std::vector<TagInfo> tags) override;
  Status CheckRecoveredTag(const TagInfo& tag, const std::set<std::string>& listed) override;
  std::vector<FileInfo> NotInMemory(const std::string& job) override;
  size_t InMemoryCount(const std::string& job) override;
  Status StartPeerRead(const std::string& job, const std::string& path, FileInfo* out, int* fd) override;
  void EndPeerRead(uint64_t buffer_id) override;

  // ---- for the Cache (with its lock held, or none) ----
  RecoveryFigures Figures() const EXCLUDES(mu_);

 private:
  // A buffer reserved here leaves the reservations (adopted or abandoned).
  void Settle(const Buffer& mem) EXCLUDES(mu_);

  const StorageRoots* const storage_;
  RecoveryHost* const host_;
  mutable Mutex mu_;  // a leaf: see the header comment
  std::map<uint64_t, uint64_t> reserved_ GUARDED_BY(mu_);  // buffer id -> capacity, reserved not yet settled
  uint64_t recovered_ GUARDED_BY(mu_) = 0;
  uint64_t mismatches_ GUARDED_BY(mu_) = 0;
};

}  // namespace tce
