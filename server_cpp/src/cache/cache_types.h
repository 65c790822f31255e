// The Cache's plain data: records, file descriptions, tags, rings, jobs
// (file states: cache/file_state.h).
#pragma once

#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "cache/file_state.h"
#include "cache/record.h"
#include "storage/identity.h"

namespace tce {

struct FileInfo {
  std::string job, tag, path;
  int32_t rank = 0;
  uint64_t size = 0;
  FileState state = FileState::kPending;
  uint64_t buffer_id = 0;
  uint64_t capacity = 0;
  int64_t created_unix_ns = 0;
  int64_t committed_unix_ns = 0;
  int64_t persisted_unix_ns = 0;
  std::string reason;      // why it FAILED
  std::string backup_holder;  // the peer holding a copy of this version; empty: none
  uint64_t version = 0;    // the allocation that wrote it
  uid_t owner_uid = 0;     // the committing client's identity: files are
  gid_t owner_gid = 0;     // persisted with its permissions
  uint32_t new_mode = 0644;  // permission bits if the file is new on storage
  bool zip_crc32 = true;     // write the CRCs into the zip headers (torch's default)
  DiskIdentity disk;
  std::vector<Record> records;
};

// One file of a checkpoint tag, as its rank reported it.
struct TagFile {
  int32_t rank = 0;
  std::string path;
  uint64_t size = 0;
  // CRC-32 of the whole file, as the node that published the version
  // computed it from its memory (for following nodes; tag_registry.h).
  uint32_t crc32 = 0;
  bool has_crc32 = false;
};

// A job's ring as a server was told it; kept in metadata so that a
// restarted server rejoins (and recovers) without being told again.
struct RingInfo {
  std::string job;
  std::string self;  // the server's own peer endpoint (the row's owner)
  int32_t node_rank = 0;
  std::vector<std::string> endpoints;
};

// A tag every rank finished (recorded by rank 0 after all ranks committed).
struct TagInfo {
  std::string job, tag;
  int64_t complete_unix_ns = 0;
  int32_t world_size = 0;
  std::vector<TagFile> files;  // sorted by (rank, path)
  uint64_t version = 0;        // the job's published version (tag_registry.h); 0: none yet
  uint64_t epoch = 0;          // the numbering `version` belongs to (tag_registry.h); 0: none yet
};

// One committed file handed to a persistence worker. The buffer is pinned
// (never reused) until FinishPersist; `fd` is the worker's own, writable.
struct PersistJob {
  std::string job, path;
  uint64_t version = 0, buffer_id = 0, size = 0, capacity = 0;
  uid_t uid = 0;  // write as this client
  gid_t gid = 0;
  uint32_t new_mode = 0644;
  bool zip_crc32 = true;
  DiskIdentity expected;  // what the path must still hold for the write to go ahead
  std::vector<Record> records;
  int fd = -1;
};

// One committed file handed to a backup worker: like PersistJob, for the
// ring successor `peer` (see cache/backup_feed.h for the other ring jobs).
struct BackupJob {
  std::string job, tag, path, peer;
  int32_t rank = 0;
  int32_t node = 0;  // our node rank in the job's ring
  uint64_t version = 0, buffer_id = 0, size = 0;
  std::vector<Record> records;
  DiskIdentity disk;  // what the path on storage held, as this server last saw it
  int fd = -1;
  const unsigned char* data = nullptr;  // the server's mapping of the buffer (pinned)
};

// Whether the caller of a blocked call went away (its RPC was cancelled:
// the client closed its channel or died). Empty: never asked.
using CallerGone = std::function<bool()>;
// How often a blocked call asks it, on the Cache's clock.
constexpr std::chrono::milliseconds kCallerGonePoll{500};

}  // namespace tce
