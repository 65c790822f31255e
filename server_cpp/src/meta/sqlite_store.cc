#include <sqlite3.h>

#include <sstream>

#include "meta/meta_store.h"
#include "meta/mysql_store.h"

namespace tce {
namespace {

const char* const kSchema[] = {
    "CREATE TABLE IF NOT EXISTS schema_version (version INTEGER NOT NULL)",
    "CREATE TABLE IF NOT EXISTS jobs (job TEXT PRIMARY KEY, first_seen_ns INTEGER NOT NULL)",
    "CREATE TABLE IF NOT EXISTS tags (job TEXT NOT NULL, tag TEXT NOT NULL, "
    "first_commit_ns INTEGER NOT NULL, PRIMARY KEY (job, tag))",
    "CREATE TABLE IF NOT EXISTS files (job TEXT NOT NULL, path TEXT NOT NULL, tag TEXT NOT NULL, "
    "rank INTEGER NOT NULL, size INTEGER NOT NULL, state TEXT NOT NULL, version INTEGER NOT NULL, "
    "records TEXT NOT NULL, created_ns INTEGER NOT NULL, committed_ns INTEGER NOT NULL, "
    "persisted_ns INTEGER NOT NULL, reason TEXT NOT NULL, uid INTEGER NOT NULL, "
    "gid INTEGER NOT NULL, PRIMARY KEY (job, path))",
    "CREATE TABLE IF NOT EXISTS servers (endpoint TEXT PRIMARY KEY, pid INTEGER NOT NULL, "
    "heartbeat_ns INTEGER NOT NULL)",
};

class SqliteStore final : public MetaStore {
 public:
  ~SqliteStore() override {
    for (sqlite3_stmt* s : {upsert_, remove_, job_, tag_}) sqlite3_finalize(s);
    sqlite3_close(db_);
  }

  Status Open(const std::string& path) {
    if (sqlite3_open_v2(path.c_str(), &db_, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE, nullptr) !=
        SQLITE_OK)
      return Fail("open " + path);
    sqlite3_busy_timeout(db_, 5000);
    Status s = Exec("PRAGMA journal_mode=WAL");
    if (s.ok()) s = Exec("PRAGMA synchronous=NORMAL");
    if (s.ok()) s = Exec("BEGIN");
    for (const char* sql : kSchema)
      if (s.ok()) s = Exec(sql);
    if (s.ok()) s = Exec("INSERT INTO schema_version SELECT 1 WHERE NOT EXISTS (SELECT 1 FROM schema_version)");
    if (s.ok()) s = Exec("COMMIT");
    if (!s.ok()) return s;
    int version = 0;
    sqlite3_stmt* q = nullptr;
    if (sqlite3_prepare_v2(db_, "SELECT MAX(version) FROM schema_version", -1, &q, nullptr) == SQLITE_OK &&
        sqlite3_step(q) == SQLITE_ROW)
      version = sqlite3_column_int(q, 0);
    sqlite3_finalize(q);
    if (version > kSchemaVersion)
      return Status::FailedPrecondition("metadata schema version " + std::to_string(version) +
                                        " is newer than this server's " +
                                        std::to_string(kSchemaVersion));
    return Prepare(&upsert_,
                   "INSERT INTO files (job, path, tag, rank, size, state, version, records, created_ns, "
                   "committed_ns, persisted_ns, reason, uid, gid) VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?) "
                   "ON CONFLICT (job, path) DO UPDATE SET tag=excluded.tag, rank=excluded.rank, "
                   "size=excluded.size, state=excluded.state, version=excluded.version, "
                   "records=excluded.records, created_ns=excluded.created_ns, "
                   "committed_ns=excluded.committed_ns, persisted_ns=excluded.persisted_ns, "
                   "reason=excluded.reason, uid=excluded.uid, gid=excluded.gid")
        .ok() && Prepare(&remove_, "DELETE FROM files WHERE job=? AND path=?").ok() &&
        Prepare(&job_, "INSERT OR IGNORE INTO jobs (job, first_seen_ns) VALUES (?, ?)").ok() &&
        Prepare(&tag_, "INSERT OR IGNORE INTO tags (job, tag, first_commit_ns) VALUES (?, ?, ?)").ok()
               ? Status::OK()
               : Fail("prepare");
  }

  Status Apply(const std::vector<MetaChange>& batch) override {
    Status s = Exec("BEGIN");
    for (const MetaChange& c : batch) {
      if (!s.ok()) break;
      const FileInfo& f = c.file;
      if (c.removed) {
        Bind(remove_, {f.job, f.path});
        s = Step(remove_);
        continue;
      }
      Bind(job_, {f.job});
      sqlite3_bind_int64(job_, 2, f.committed_unix_ns);
      s = Step(job_);
      if (s.ok() && !f.tag.empty()) {
        Bind(tag_, {f.job, f.tag});
        sqlite3_bind_int64(tag_, 3, f.committed_unix_ns);
        s = Step(tag_);
      }
      if (!s.ok()) break;
      Bind(upsert_, {f.job, f.path, f.tag});
      sqlite3_bind_int64(upsert_, 4, f.rank);
      sqlite3_bind_int64(upsert_, 5, static_cast<int64_t>(f.size));
      std::string state = FileStateName(f.state), records = EncodeRecords(f.records);
      sqlite3_bind_text(upsert_, 6, state.c_str(), -1, SQLITE_TRANSIENT);
      sqlite3_bind_int64(upsert_, 7, static_cast<int64_t>(f.version));
      sqlite3_bind_text(upsert_, 8, records.c_str(), -1, SQLITE_TRANSIENT);
      sqlite3_bind_int64(upsert_, 9, f.created_unix_ns);
      sqlite3_bind_int64(upsert_, 10, f.committed_unix_ns);
      sqlite3_bind_int64(upsert_, 11, f.persisted_unix_ns);
      sqlite3_bind_text(upsert_, 12, f.reason.c_str(), -1, SQLITE_TRANSIENT);
      sqlite3_bind_int64(upsert_, 13, f.owner_uid);
      sqlite3_bind_int64(upsert_, 14, static_cast<int64_t>(f.owner_gid));
      s = Step(upsert_);
    }
    if (s.ok()) return Exec("COMMIT");
    Status ignored = Exec("ROLLBACK");
    (void)ignored;
    return s;
  }

  Status LoadFiles(std::vector<FileInfo>* out) override {
    sqlite3_stmt* q = nullptr;
    if (sqlite3_prepare_v2(db_,
                           "SELECT job, path, tag, rank, size, state, version, records, created_ns, "
                           "committed_ns, persisted_ns, reason, uid, gid FROM files ORDER BY job, path",
                           -1, &q, nullptr) != SQLITE_OK)
      return Fail("select files");
    int rc;
    while ((rc = sqlite3_step(q)) == SQLITE_ROW) {
      FileInfo f;
      auto text = [q](int i) {
        const unsigned char* t = sqlite3_column_text(q, i);
        return std::string(t ? reinterpret_cast<const char*>(t) : "");
      };
      f.job = text(0);
      f.path = text(1);
      f.tag = text(2);
      f.rank = sqlite3_column_int(q, 3);
      f.size = static_cast<uint64_t>(sqlite3_column_int64(q, 4));
      if (!ParseFileState(text(5), &f.state)) f.state = FileState::kFailed;
      f.version = static_cast<uint64_t>(sqlite3_column_int64(q, 6));
      DecodeRecords(text(7), &f.records);
      f.created_unix_ns = sqlite3_column_int64(q, 8);
      f.committed_unix_ns = sqlite3_column_int64(q, 9);
      f.persisted_unix_ns = sqlite3_column_int64(q, 10);
      f.reason = text(11);
      f.owner_uid = static_cast<uid_t>(sqlite3_column_int64(q, 12));
      f.owner_gid = static_cast<gid_t>(sqlite3_column_int64(q, 13));
      out->push_back(std::move(f));
    }
    sqlite3_finalize(q);
    return rc == SQLITE_DONE ? Status::OK() : Fail("read files");
  }

  Status Heartbeat(const std::string& endpoint, int64_t pid) override {
    sqlite3_stmt* q = nullptr;
    if (sqlite3_prepare_v2(db_,
                           "INSERT INTO servers (endpoint, pid, heartbeat_ns) VALUES (?, ?, "
                           "CAST((julianday('now') - 2440587.5) * 86400000000000 AS INTEGER)) "
                           "ON CONFLICT (endpoint) DO UPDATE SET pid=excluded.pid, "
                           "heartbeat_ns=excluded.heartbeat_ns",
                           -1, &q, nullptr) != SQLITE_OK)
      return Fail("prepare heartbeat");
    sqlite3_bind_text(q, 1, endpoint.c_str(), -1, SQLITE_TRANSIENT);
    sqlite3_bind_int64(q, 2, pid);
    Status s = Step(q);
    sqlite3_finalize(q);
    return s;
  }

 private:
  Status Fail(const std::string& what) {
    return Status::Unavailable("sqlite " + what + ": " + (db_ ? sqlite3_errmsg(db_) : "no database"));
  }
  Status Exec(const char* sql) {
    char* err = nullptr;
    if (sqlite3_exec(db_, sql, nullptr, nullptr, &err) == SQLITE_OK) return Status::OK();
    std::string msg = err ? err : "error";
    sqlite3_free(err);
    return Status::Unavailable(std::string("sqlite: ") + msg);
  }
  Status Prepare(sqlite3_stmt** s, const char* sql) {
    return sqlite3_prepare_v2(db_, sql, -1, s, nullptr) == SQLITE_OK ? Status::OK() : Fail("prepare");
  }
  static void Bind(sqlite3_stmt* s, std::initializer_list<std::string> texts) {
    sqlite3_reset(s);
    sqlite3_clear_bindings(s);
    int i = 1;
    for (const std::string& t : texts) sqlite3_bind_text(s, i++, t.c_str(), -1, SQLITE_TRANSIENT);
  }
  Status Step(sqlite3_stmt* s) {
    int rc = sqlite3_step(s);
    sqlite3_reset(s);
    return rc == SQLITE_DONE || rc == SQLITE_ROW ? Status::OK() : Fail("write");
  }

  sqlite3* db_ = nullptr;
  sqlite3_stmt *upsert_ = nullptr, *remove_ = nullptr, *job_ = nullptr, *tag_ = nullptr;
};

}  // namespace

Status OpenMetaStore(const std::string& url, std::unique_ptr<MetaStore>* out) {
  const std::string scheme = "sqlite://";
  if (url.compare(0, scheme.size(), scheme) == 0) {
    std::string path = url.substr(scheme.size());
    if (path.empty() || path[0] != '/')
      return Status::InvalidArgument("sqlite URL needs an absolute path (sqlite:///dir/tce.db): " + url);
    auto store = std::make_unique<SqliteStore>();
    Status s = store->Open(path);
    if (!s.ok()) return s;
    *out = std::move(store);
    return Status::OK();
  }
  if (url.compare(0, 8, "mysql://") == 0) return OpenMysqlStore(url, out);
  return Status::NotSupported("metadata URL scheme not supported: " + url +
                              " (sqlite:///path or mysql://user:pass@host:port/db)");
}

std::string RedactUrl(const std::string& url) {
  size_t scheme = url.find("://");
  if (scheme == std::string::npos) return url;
  size_t at = url.rfind('@');
  size_t colon = url.find(':', scheme + 3);
  if (at == std::string::npos || colon == std::string::npos || colon > at) return url;
  return url.substr(0, colon + 1) + "***" + url.substr(at);
}

std::string EncodeRecords(const std::vector<Record>& records) {
  std::ostringstream out;
  for (const Record& r : records)  // length-prefixed name: file names may hold any separator
    out << r.name.size() << ':' << r.name << ' ' << r.header_offset << ' ' << r.data_offset << ' '
        << r.size << ' ' << r.central_offset << ' ' << r.crc32 << '\n';
  return out.str();
}

bool DecodeRecords(const std::string& text, std::vector<Record>* out) {
  size_t pos = 0;
  while (pos < text.size()) {
    size_t colon = text.find(':', pos);
    if (colon == std::string::npos) return false;
    size_t len = std::stoull(text.substr(pos, colon - pos));
    if (colon + 1 + len > text.size()) return false;
    Record r;
    r.name = text.substr(colon + 1, len);
    size_t eol = text.find('\n', colon + 1 + len);
    if (eol == std::string::npos) return false;
    std::istringstream nums(text.substr(colon + 1 + len, eol - colon - 1 - len));
    if (!(nums >> r.header_offset >> r.data_offset >> r.size >> r.central_offset >> r.crc32))
      return false;
    out->push_back(std::move(r));
    pos = eol + 1;
  }
  return true;
}

}  // namespace tce
