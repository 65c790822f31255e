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

namespace tce {

struct MetaChange {
  FileInfo file;
  bool removed = false;
};

class MetaStore {
 public:
  static constexpr int kSchemaVersion = 1;
  virtual ~MetaStore() = default;
  // Applies a batch in one transaction (all or nothing).
  virtual Status Apply(const std::vector<MetaChange>& batch) = 0;
  virtual Status LoadFiles(std::vector<FileInfo>* out) = 0;
  virtual Status Heartbeat(const std::string& endpoint, int64_t pid) = 0;
};

// The URL with any password replaced by "***" (for status and logs).
std::string RedactUrl(const std::string& url);

// "sqlite:///abs/path" -> SQLite. Other schemes: a clear NotSupported.
Status OpenMetaStore(const std::string& url, std::unique_ptr<MetaStore>* out);

// The record table as one text column, a line per record:
// "<name length>:<name> header data size central crc".
std::string EncodeRecords(const std::vector<Record>& records);
bool DecodeRecords(const std::string& text, std::vector<Record>* out);

}  // namespace tce
