// BackupStore: the copies this server holds for its ring predecessor, in
// memfd buffers of their own, bounded by their own share of the memory
// budget (so holding a neighbour's checkpoint never starves the node's own
// training ranks). Keyed by (job, path); a newer version replaces the older.
// Thread-safe.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "cache/buffer.h"
#include "cache/cache_types.h"
#include "common/mutex.h"
#include "common/status.h"

namespace tce {

// A buffer with a writable mapping kept for its lifetime and faulted in
// once, so receiving a copy into a recycled one takes no page faults.
class MappedBuffer {
 public:
  static Status Create(uint64_t id, uint64_t capacity, std::unique_ptr<MappedBuffer>* out);
  ~MappedBuffer();
  Buffer& buffer() { return *buffer_; }
  unsigned char* data() { return data_; }
  uint64_t capacity() const { return buffer_->capacity(); }

 private:
  MappedBuffer(std::unique_ptr<Buffer> b, unsigned char* data) : buffer_(std::move(b)), data_(data) {}
  std::unique_ptr<Buffer> buffer_;
  unsigned char* data_;
};

struct HeldBackup {
  FileInfo file;   // job, tag, rank, path, size, version, records (with CRCs)
  bool check_ranges = false;  // file.records are CheckRanges (the file has none)
  std::string owner;  // the peer that sent it
  int32_t owner_node = 0;  // its node rank in the job's ring
  uid_t job_uid = 0;       // the uid the job belongs to there (and here)
  std::unique_ptr<MappedBuffer> buffer;
};

// A complete tag of the predecessor's job (its rank 0 recorded it there).
struct HeldTag {
  TagInfo tag;
  std::string owner;       // the peer that sent it
  int32_t owner_node = 0;  // its node rank in the job's ring
  uid_t job_uid = 0;       // the uid the job belongs to there (and here)
};

struct BackupStoreStats {
  uint64_t budget = 0, used = 0, files = 0, bytes = 0, rejected_corrupt = 0, reused = 0, tags = 0;
};

class BackupStore {
 public:
  explicit BackupStore(uint64_t budget) : budget_(budget) {}

  // A buffer for an incoming copy of `size` bytes of (job, path): a free
  // one that fits (the copies a newer one replaced are recycled), else a new
  // one. Returned by Commit or Abandon. RESOURCE_EXHAUSTED when the share is full.
  Status Reserve(const std::string& job, const std::string& path, uint64_t size,
                 std::unique_ptr<MappedBuffer>* out);
  void Abandon(std::unique_ptr<MappedBuffer> buffer);
  // Keeps the received copy (its CRCs were checked), replacing an older one.
  void Commit(HeldBackup held);
  // The owner let go of (job, path) (version 0: any). False if not held,
  // or (`from` non-empty) not held from `from`: only the sender drops it.
  bool Drop(const std::string& job, const std::string& path, uint64_t version, const std::string& from = "");
  // The owner (`from`, the copy's sender) wrote the copy's version of
  // (job, path) to storage as `disk`: kept with the copy. False if no such
  // copy is held from `from`.
  bool NotePersisted(const std::string& job, const std::string& path, uint64_t version,
                     const std::string& from, const DiskIdentity& disk);
  // The copies held for (job, owner_node).
  std::vector<HeldBackup> List(const std::string& job, int32_t owner_node);  // buffer left null
  // A read-only fd of a held copy, and its description.
  Status Open(const std::string& job, const std::string& path, HeldBackup* info, int* fd);
  // The same for this server's own use of a copy (a load, a ranged read):
  // only one that a member of the job's `ring` sent (job isolation, as for a
  // peer's read). NOT_FOUND if none is held; PERMISSION_DENIED, saying who
  // sent it, if its sender is not in `ring`.
  Status OpenForRing(const std::string& job, const std::string& path,
                     const std::vector<std::string>& ring, HeldBackup* info, int* fd);
  void CountCorrupt();
  BackupStoreStats Stats();

  // Keeps a tag the owner recorded, replacing the same (job, tag), unless
  // the one held is newer. The tags held for one (job, owner_node) take at
  // most kMaxTagBytesPerOwner (the oldest go; they fit one peer message),
  // all of them kMaxTagBytes (RESOURCE_EXHAUSTED beyond): a peer cannot
  // grow them without bound.
  Status HoldTag(HeldTag tag);
  // The tags held for (job, owner_node), oldest first.
  std::vector<HeldTag> Tags(const std::string& job, int32_t owner_node);
  // What a tag counts against those bounds (about its encoded size).
  static size_t TagBytes(const TagInfo& tag);

  static constexpr size_t kMaxTagBytesPerOwner = size_t{16} << 20;
  static constexpr size_t kMaxTagBytes = size_t{256} << 20;

 private:
  const uint64_t budget_;
  Mutex mu_;
  uint64_t used_ GUARDED_BY(mu_) = 0;  // capacity of held and reserved buffers
  uint64_t next_id_ GUARDED_BY(mu_) = 1;
  uint64_t corrupt_ GUARDED_BY(mu_) = 0;
  uint64_t reused_ GUARDED_BY(mu_) = 0;
  std::map<std::pair<std::string, std::string>, HeldBackup> held_ GUARDED_BY(mu_);
  std::vector<std::unique_ptr<MappedBuffer>> free_ GUARDED_BY(mu_);
  // By (job, owner_node), then tag name.
  std::map<std::pair<std::string, int32_t>, std::map<std::string, HeldTag>> tags_ GUARDED_BY(mu_);
  size_t tag_bytes_ GUARDED_BY(mu_) = 0;  // TagBytes of every tag held
};

// Checks every record's payload in `data` against its CRC-32. Names the first
// record that differs.
Status VerifyRecords(const unsigned char* data, uint64_t size, const std::vector<Record>& records);
// The same, for CRCs already computed (one per record, in order), of records
// found inside the file by CheckRecordBounds (INVALID_ARGUMENT otherwise).
Status CheckRecordBounds(uint64_t size, const std::vector<Record>& records);
Status CompareCrcs(const std::vector<Record>& records, const std::vector<uint32_t>& computed);

}  // namespace tce
