// MetaStore: the durable record of every file's state (jobs, tags, files,
// servers), one versioned schema applied idempotently on open. Backends are
// chosen by URL in one factory: "sqlite:///abs/path.db" (the embedded
// default). Calls come from one thread (the MetaWriter); not thread-safe.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "cache/cache_types.h"
#include "common/status.h"
#include "meta/row_codec.h"  // the text columns both stores share
#include "meta/schema.h"

namespace tce {

// One queued change: a file's new state (or its removal), or a completed tag.
struct MetaChange {
  FileInfo file;
  bool removed = false;
  bool is_tag = false;  // then only `tag` matters
  TagInfo tag;
  bool is_ring = false;  // then only `ring` matters
  RingInfo ring;
};

class MetaStore {
 public:
  // The schema's version (meta/schema.h); an older database is migrated in
  // place when opened.
  static constexpr int kSchemaVersion = schema::kVersion;
  virtual ~MetaStore() = default;
  // Applies a batch in one transaction (all or nothing).
  virtual Status Apply(const std::vector<MetaChange>& batch) = 0;
  virtual Status LoadFiles(std::vector<FileInfo>* out) = 0;
  // Tags recorded complete (complete_ns != 0).
  virtual Status LoadTags(std::vector<TagInfo>* out) = 0;
  // The rings recorded for the server at peer endpoint `self`.
  virtual Status LoadRings(const std::string& self, std::vector<RingInfo>* out) = 0;
  virtual Status Heartbeat(const std::string& endpoint, int64_t pid) = 0;
  // Whether the database is still the one opened (SQLite: the files at its
  // path are the ones open, same device and inode); DATA_LOSS when they were
  // deleted or replaced. A server store (MySQL) is always intact here.
  virtual Status CheckIntact() { return Status::OK(); }
  // After CheckIntact failed: closes the database and opens the one at the
  // same place again, a fresh one when it is gone (a foreign file found there
  // is renamed aside first). The caller then writes the full state again.
  virtual Status Reset() { return Status::NotSupported("this metadata store cannot be reset"); }
};

// The URL with any password replaced by "***" (for status and logs).
std::string RedactUrl(const std::string& url);

// "sqlite:///abs/path" -> SQLite, "mysql://..." -> MySQL. Other schemes: a
// clear NotSupported. `server_id` names this server's rows in a store that
// several servers share (MySQL: each reads and writes only its own files
// and tags; required there). A SQLite file belongs to one server (it holds
// it exclusively), so its rows carry no server.
Status OpenMetaStore(const std::string& url, std::unique_ptr<MetaStore>* out,
                     const std::string& server_id = "");

}  // namespace tce
