// MetaStore: the durable record of what a server knows (jobs, files and
// their states, complete tags, rings, heartbeats), so that a restarted
// server re-indexes what it had. Every backend keeps the one schema of
// meta/schema.h, applied idempotently when opened (an older database is
// migrated in place, a newer one refused), and checks every row it reads
// back (meta/row_codec.h): a damaged row is logged and skipped.
//
// Backends, chosen by URL in OpenMetaStore (meta/meta_store.cc):
//   sqlite:///abs/path.db           embedded; the file belongs to one server
//   mysql://user:pass@host:port/db  shared by several servers, each reading
//                                   and writing only its own rows
// A store is used from one thread (the MetaWriter's); not thread-safe.
#pragma once

#include <memory>
#include <string>
#include <variant>
#include <vector>

#include "cache/cache_types.h"
#include "common/status.h"
#include "meta/schema.h"

namespace tce {

// A file gone from the cache (removed, replaced by nothing): its row goes.
struct FileRemoved {
  std::string job, path;
};

// One queued change, of one of four kinds: a file's new state, a file's
// removal, a completed tag, or a job's ring as this server was told it.
using MetaChange = std::variant<FileInfo, FileRemoved, TagInfo, RingInfo>;

class MetaStore {
 public:
  static constexpr int kSchemaVersion = schema::kVersion;
  virtual ~MetaStore() = default;
  // Applies a batch in one transaction (all or nothing). UNAVAILABLE while
  // the database cannot be reached (the caller keeps the batch and retries);
  // FAILED_PRECONDITION once it cannot be trusted (see CheckIntact).
  virtual Status Apply(const std::vector<MetaChange>& batch) = 0;
  // This server's files.
  virtual Status LoadFiles(std::vector<FileInfo>* out) = 0;
  // This server's tags recorded complete (complete_ns != 0).
  virtual Status LoadTags(std::vector<TagInfo>* out) = 0;
  // The rings recorded for the server at peer endpoint `self`.
  virtual Status LoadRings(const std::string& self, std::vector<RingInfo>* out) = 0;
  // Records that the server at `endpoint` (process `pid`) is alive now.
  virtual Status Heartbeat(const std::string& endpoint, int64_t pid) = 0;
  // Whether the database is still the one opened (SQLite: the files at its
  // path are the ones open, same device and inode); DATA_LOSS when they were
  // deleted or replaced. FAILED_PRECONDITION when it was damaged or written
  // over in place (SQLite): the store writes nothing more into it, and says
  // so from every call, until the file is moved away (then DATA_LOSS). A
  // database server's store is always intact here.
  virtual Status CheckIntact() { return Status::OK(); }
  // After CheckIntact failed: closes the database and opens the one at the
  // same place again, a fresh one when it is gone (a foreign file found there
  // is renamed aside first). The caller then writes the full state again.
  virtual Status Reset() { return Status::NotSupported("this metadata store cannot be reset"); }
};

// The URL schemes this build can open ("sqlite", and "mysql" when built
// with MariaDB's connector: the CMake option TCE_WITH_MYSQL).
std::vector<std::string> MetaStoreSchemes();

// Opens the store `url` names. `server_id` names this server's rows in a
// store several servers share (MySQL: required there); a SQLite file
// belongs to one server (it holds it exclusively), so its rows carry none.
// INVALID_ARGUMENT for a malformed URL; NOT_SUPPORTED for an unknown scheme
// or one this build lacks (saying which option it needs); the backend's
// error when the database cannot be opened.
Status OpenMetaStore(const std::string& url, std::unique_ptr<MetaStore>* out,
                     const std::string& server_id = "");

// The URL with any password replaced by "***" (for status and logs).
std::string RedactUrl(const std::string& url);

}  // namespace tce
