// StorageAccess: the node's reads of storage on behalf of its clients and
// of the ring. A load that misses memory brings the file from storage into
// the cache (an object root's object, or a directory root's file read as
// the user), once at a time per file however many loads ask; the
// cooperative restore claims the files each node reads (docs/ring.md);
// clients read ranges of objects, delete and list them as themselves; and
// where each job's loads took their bytes from is counted.
//
// It serves the RPC layer through StoredFiles and the ring through
// StorageLoads. Who may act on a job, the buffers a read fills and the
// file it becomes are the Cache's: it asks through StorageAccessHost, and
// holds no lock while it reads storage. Thread-safe.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "cache/buffer.h"
#include "cache/cache_types.h"
#include "cache/load_split.h"
#include "cache/persist_feed.h"  // FileKey
#include "cache/storage_loads.h"
#include "cache/stored_files.h"
#include "common/clock.h"
#include "common/mutex.h"
#include "common/single_flight.h"
#include "common/status.h"
#include "env/env.h"
#include "storage/identity.h"
#include "storage/object_owner.h"
#include "storage/storage_roots.h"

namespace tce {

// What StorageAccess asks of the node's cache. Each call takes the cache's
// lock; none calls StorageAccess back.
class StorageAccessHost {
 public:
  virtual ~StorageAccessHost() = default;
  struct Caller {
    uid_t uid = 0;
    gid_t gid = 0;
    Requester requester;  // whom an object call is for (storage/object_owner.h)
  };
  // The session may `what` on `job` (its owner; with `claim`, claiming a
  // job nobody owns): its ids. The session's or the job's refusal.
  virtual Status Authorize(const std::string& session, const std::string& job, const std::string& what,
                           bool claim, Caller* out) = 0;
  // Whom the server reads storage as for `job` when no client of it asks:
  // the job's owner (NOT_FOUND when no client set the job's ring here).
  virtual Status JobOwnerIds(const std::string& job, uid_t* uid, gid_t* gid) = 0;
  // The owner of `job` as a requester (none: a requester no object's owner is).
  virtual Requester JobRequester(const std::string& job) = 0;
  virtual Requester RequesterOf(uid_t uid) = 0;
  // The uid `job` belongs to here (its owner, or whoever set its ring).
  virtual bool JobUid(const std::string& job, uid_t* uid) = 0;
  // Whether (job, path) has its bytes in memory here.
  virtual bool InMemory(const std::string& job, const std::string& path) = 0;
  // A buffer of `size` bytes within the budget (RecoveryStore's), and its
  // return when the read failed.
  virtual Status ReserveBuffer(uint64_t size, std::unique_ptr<Buffer>* out) = 0;
  virtual void ReturnBuffer(std::unique_ptr<Buffer> mem) = 0;
  // `mem`, read from storage (`from`, in `secs`), becomes the PERSISTED file
  // (job, path) of uid/gid with storage identity `disk`;
  // FAILED_PRECONDITION when a save or another read put it here meanwhile.
  virtual Status InstallFetched(const std::string& job, const std::string& path, std::unique_ptr<Buffer> mem,
                                uint64_t size, uid_t uid, gid_t gid, DiskIdentity disk, const std::string& from,
                                double secs) = 0;
};

struct StorageAccessOptions {
  // Loads that miss also read directory roots' files (fetch_on_miss); object
  // roots' objects are always read.
  bool fetch_files = false;
};

class StorageAccess : public StoredFiles, public StorageLoads {
 public:
  // `host` and `clock` outlive it; `storage` is never null.
  StorageAccess(std::shared_ptr<const StorageRoots> storage, StorageAccessOptions options, Clock* clock,
                StorageAccessHost* host);
  StorageAccess(const StorageAccess&) = delete;
  StorageAccess& operator=(const StorageAccess&) = delete;

  // ---- StoredFiles (cache/stored_files.h) ----
  bool IsObjectPath(const std::string& path) const override;
  bool FetchesOnMiss(const std::string& path) override;
  Status FetchFromStorage(const std::string& session, const std::string& job, const std::string& path) override;
  void NoteLoad(const std::string& job, LoadFrom from, uint64_t bytes) override { loads_.Note(job, from, bytes); }
  std::vector<JobLoadSplit> LoadSplits(bool admin, uid_t uid) override;
  Status ReadObjectRange(const std::string& session, const std::string& job, const std::string& path,
                         uint64_t offset, uint64_t length, std::string* data, unsigned char* into,
                         ObjectId* id) override;
  Status DeleteObject(const std::string& session, const std::string& job, const std::string& path) override;
  Status ListStored(const std::string& session, const std::string& job, const std::string& dir,
                    std::vector<FileInfo>* out) override;

  // ---- StorageLoads (cache/storage_loads.h) ----
  bool UnderStorage(const std::string& path) override;
  Status LoadFromStorage(const std::string& job, const std::string& path, bool for_peer) override;
  Status ListStorageDir(const std::string& job, const std::string& dir, std::vector<ListedObject>* out) override;
  std::string ClaimRead(const std::string& job, const std::string& path, const std::string& node) override
      EXCLUDES(claims_mu_);
  size_t DropClaims(const std::string& job, const std::string& node) override EXCLUDES(claims_mu_);

  // For Stats: loads that shared another load's read; ranges of objects read.
  uint64_t fetches_shared() const { return fetches_shared_.load(); }
  uint64_t ranges_read() const { return ranges_read_.load(); }

 private:
  // (job, path) read as uid/gid into a new PERSISTED file, once at a time
  // per file (a second load waits for the read under way and shares its
  // outcome); from an object root's store, else from the directory root
  // the file's directory resolves under (opened through its store as the
  // user). `read_here` (optional) is set when this call read it (not
  // another load's read, nor a file here already).
  Status FetchStored(const std::string& job, const std::string& path, uid_t uid, gid_t gid, bool for_peer,
                     bool* read_here = nullptr);
  Status FetchObjectOnce(const ObjectRoot& root, const std::string& key, const std::string& job,
                         const std::string& path, uid_t uid, gid_t gid, uint64_t* size);
  Status FetchFileOnce(const std::string& job, const std::string& path, uid_t uid, gid_t gid, uint64_t* size);
  Status OpenAsUser(const std::string& dir, uid_t uid, gid_t gid, std::unique_ptr<Directory>* d);
  // A new buffer of `size` bytes filled by `read` through a mapping of it;
  // given back when anything fails. *secs: the read's time.
  Status ReadIntoBuffer(uint64_t size, const std::string& path, const std::function<Status(char*)>& read,
                        std::unique_ptr<Buffer>* mem, double* secs);
  // The same for a reader that hands its bytes over in pieces (a file's):
  // they are written into the buffer's memfd, which costs about 60% of
  // faulting in a mapping of new shmem pages (hugetlb: through a mapping).
  Status FillBuffer(uint64_t size, const std::string& path, const std::function<Status(const Directory::Sink&)>& read,
                    std::unique_ptr<Buffer>* mem, double* secs);
  Status ReadThroughMapping(const Buffer& mem, uint64_t size, const std::string& path,
                            const std::function<Status(char*)>& read, double* secs);
  // The object root holding `dir`'s files, with the key prefix they share
  // (its key of a file "x" there, less the "x"); null when none.
  const ObjectRoot* ObjectDir(const std::string& dir, std::string* prefix) const;

  const std::shared_ptr<const StorageRoots> storage_;
  const bool fetch_files_;
  Clock* const clock_;
  StorageAccessHost* const host_;
  SingleFlight<FileKey> fetching_;  // reads of storage under way (FetchStored)
  std::atomic<uint64_t> fetches_shared_{0};
  std::atomic<uint64_t> ranges_read_{0};
  LoadSplit loads_;  // its own lock
  struct ReadClaim {
    std::string node;
    Clock::TimePoint at;
  };
  Mutex claims_mu_;
  std::map<FileKey, ReadClaim> read_claims_ GUARDED_BY(claims_mu_);  // ClaimRead
};

}  // namespace tce
