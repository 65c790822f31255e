// MetaStore on an embedded SQLite file: sqlite:///abs/path.db
#include <fcntl.h>
#include <sqlite3.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>

#include "common/clock.h"
#include "common/logging.h"
#include "common/validate.h"
#include "env/env.h"
#include "meta/sqlite_store.h"
#include "meta/row_codec.h"
#include "meta/schema.h"

namespace tce {
namespace {

const schema::Dialect& kDialect = schema::kSqlite;

// TCE's mark in the database header (PRAGMA application_id): "TCE1".
constexpr int64_t kApplicationId = 0x54434531;
// The WAL is copied into the database file (checkpointed) once it holds
// this many pages; SQLite's own automatic checkpoints are off.
constexpr int kCheckpointPages = 1000;
constexpr size_t kHeaderBytes = 100;

// What to do about a database the server cannot trust, while it runs.
std::string RunningAdvice(const std::string& path) {
  return "nothing more is written to it and changes stay queued; move it aside (mv " + path + " " + path +
         ".broken) and the server writes everything it knows into a fresh database";
}

// What to do about a database the server cannot trust, at start.
std::string StartAdvice(const std::string& path) {
  return "Move it aside and start again: mv " + path + " " + path + ".broken (and mv " + path + "-wal " + path +
         "-wal.broken if it exists); the server then starts with empty metadata: files on storage still load "
         "from there, and a ring member gets its copies back from its successor once the job tells it the ring";
}

// The database file as the store last left it: between the store's own
// checkpoints nothing else writes it, so any change is someone else's.
struct FileMark {
  off_t size = 0;
  timespec mtime{};
  unsigned char header[kHeaderBytes] = {};
};

// Reads the size, modification time and header (zeros past a short file)
// of the file open at `fd`.
bool ReadMark(int fd, FileMark* out) {
  struct stat st;
  std::memset(out->header, 0, sizeof(out->header));
  if (::fstat(fd, &st) != 0 || ::pread(fd, out->header, sizeof(out->header), 0) < 0) return false;
  out->size = st.st_size;
  out->mtime = st.st_mtim;
  return true;
}

int64_t BigEndian32(const unsigned char* p) {
  return (int64_t{p[0]} << 24) | (p[1] << 16) | (p[2] << 8) | p[3];
}

class SqliteStore final : public MetaStore, private schema::Connection {
 public:
  // What is wrong with the database file, with no advice ("" when nothing).
  const std::string& untrusted_why() const { return untrusted_why_; }
  // Checkpoints into the database file only if it is still as it was left.
  ~SqliteStore() override {
    Status intact = db_ ? CheckIntact() : Status::OK();
    (void)intact;
    Close();
  }

  // FAILED_PRECONDITION when the file at `path` is not a TCE database
  // (not SQLite, damaged, or another program's): nothing is written to it.
  Status Open(const std::string& path) {
    path_ = path;
    untrusted_ = Status::OK();
    wal_pages_ = 0;
    if (sqlite3_open_v2(path.c_str(), &db_, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE, nullptr) !=
        SQLITE_OK)
      return Fail("open " + path);
    // Every user's job names, paths and tags: the server's alone (SQLite
    // gives its WAL file the database's mode; a WAL left by an earlier run
    // is tightened too).
    for (const std::string& f : {path, path + "-wal"})
      if (::chmod(f.c_str(), 0600) != 0 && errno != ENOENT) return Status::FromErrno(errno, "chmod " + f);
    sqlite3_busy_timeout(db_, 5000);
    // Exclusive locking before WAL: SQLite keeps the WAL index in heap memory
    // instead of an mmap'ed -shm file, which would SIGBUS the server when it
    // cannot be grown or is truncated under it. It also keeps every other
    // process (a second server on the same state_dir) out while this one runs.
    Status s = Exec("PRAGMA locking_mode=EXCLUSIVE");
    if (s.ok()) s = CheckOwnFile();
    if (s.ok()) s = Exec("PRAGMA journal_mode=WAL");
    if (s.ok()) s = Exec("PRAGMA synchronous=NORMAL");
    if (s.ok()) s = schema::ApplySchema(kDialect, this, path);
    if (s.ok()) s = Exec("PRAGMA application_id=" + std::to_string(kApplicationId));
    if (!s.ok()) return s;
    // Only the store's own checkpoints write the database file from now on
    // (the hook replaces SQLite's automatic ones), each after checking that
    // the file is still as it left it: see CheckIntact.
    sqlite3_wal_hook(db_, &SqliteStore::WalHook, this);
    if (sqlite3_wal_checkpoint_v2(db_, nullptr, SQLITE_CHECKPOINT_TRUNCATE, nullptr, nullptr) != SQLITE_OK)
      return Fail("checkpoint");
    // The files the handle has open, to notice their deletion or replacement.
    // The database file is read through a descriptor of its own, open as
    // long as SQLite's: closing any descriptor of the file would drop the
    // process's POSIX locks on it, SQLite's exclusive lock with them.
    fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    struct stat db, wal;
    if (fd_ < 0 || ::fstat(fd_, &db) != 0 || ::stat((path + "-wal").c_str(), &wal) != 0 || !ReadMark(fd_, &mark_))
      return Status::Unavailable("sqlite " + path + ": the database or its WAL vanished while opening");
    dev_ = db.st_dev;
    ino_ = db.st_ino;
    wal_dev_ = wal.st_dev;
    wal_ino_ = wal.st_ino;
    using schema::InsertSql;
    return Prepare(&upsert_, InsertSql(kDialect, "files",
                                       {{"job"}, {"path"}, {"tag"}, {"rank"}, {"size"}, {"state"}, {"version"},
                                        {"records"}, {"created_ns"}, {"committed_ns"}, {"persisted_ns"},
                                        {"reason"}, {"uid"}, {"gid"}},
                                       schema::NonKeyColumns("files")))
                   .ok() &&
               Prepare(&remove_, schema::DeleteByKeySql(kDialect, "files")).ok() &&
               Prepare(&job_, InsertSql(kDialect, "jobs", {{"job"}, {"first_seen_ns"}})).ok() &&
               Prepare(&tag_, InsertSql(kDialect, "tags", {{"job"}, {"tag"}, {"first_commit_ns"}})).ok() &&
               Prepare(&done_, InsertSql(kDialect, "tags",
                                         {{"job"}, {"tag"}, {"first_commit_ns"}, {"complete_ns"}, {"world_size"},
                                          {"files"}, {"version"}, {"epoch"}},
                                         {"complete_ns", "world_size", "files", "version", "epoch"}))
                   .ok()
               ? Status::OK()
               : Fail("prepare");
  }

  // A file's new state: its job and tag rows, then its own.
  Status ApplyFile(const FileInfo& f) {
    Bind(job_, {f.job});
    sqlite3_bind_int64(job_, 2, f.committed_unix_ns);
    Status s = Step(job_);
    if (s.ok() && !f.tag.empty()) {
      Bind(tag_, {f.job, f.tag});
      sqlite3_bind_int64(tag_, 3, f.committed_unix_ns);
      s = Step(tag_);
    }
    if (!s.ok()) return s;
    Bind(upsert_, {f.job, f.path, f.tag});
    sqlite3_bind_int64(upsert_, 4, f.rank);
    sqlite3_bind_int64(upsert_, 5, static_cast<int64_t>(f.size));
    std::string state = FileStateName(f.state), records = EncodeRecords(f.records);
    BindText(upsert_, 6, state);
    sqlite3_bind_int64(upsert_, 7, static_cast<int64_t>(f.version));
    BindText(upsert_, 8, records);
    sqlite3_bind_int64(upsert_, 9, f.created_unix_ns);
    sqlite3_bind_int64(upsert_, 10, f.committed_unix_ns);
    sqlite3_bind_int64(upsert_, 11, f.persisted_unix_ns);
    BindText(upsert_, 12, f.reason);
    sqlite3_bind_int64(upsert_, 13, f.owner_uid);
    sqlite3_bind_int64(upsert_, 14, static_cast<int64_t>(f.owner_gid));
    return Step(upsert_);
  }

  Status Apply(const std::vector<MetaChange>& batch) override {
    if (!untrusted_.ok()) return untrusted_;
    Status s = Exec("BEGIN");
    for (const MetaChange& c : batch) {
      if (!s.ok()) break;
      if (const TagInfo* tag = std::get_if<TagInfo>(&c)) {
        s = ApplyTag(*tag);
      } else if (const RingInfo* ring = std::get_if<RingInfo>(&c)) {
        s = ApplyRing(*ring);
      } else if (const FileRemoved* gone = std::get_if<FileRemoved>(&c)) {
        Bind(remove_, {gone->job, gone->path});
        s = Step(remove_);
      } else {
        s = ApplyFile(std::get<FileInfo>(c));
      }
    }
    if (s.ok() && (s = Exec("COMMIT")).ok()) {
      MaybeCheckpoint();
      return s;
    }
    Status ignored = Exec("ROLLBACK");
    (void)ignored;
    return s;
  }

  // A row that fails its checks is logged (table and key) and skipped: a
  // damaged database costs that row, never the server.
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
      f.job = Text(q, 0);
      f.path = Text(q, 1);
      f.tag = Text(q, 2);
      int64_t n[9];
      const int int_columns[9] = {3, 4, 6, 8, 9, 10, 12, 13, -1};
      Status s = CheckFileKeys(f);
      for (int i = 0; s.ok() && int_columns[i] >= 0; ++i)
        if (!Int(q, int_columns[i], &n[i])) s = Status::DataLoss(std::string(sqlite3_column_name(q, int_columns[i])) + ": not an integer");
      if (s.ok() && !ParseFileState(Text(q, 5), &f.state)) s = Status::DataLoss("state: unknown '" + Printable(Text(q, 5), 32) + "'");
      if (s.ok()) s = DecodeRecords(Text(q, 7), &f.records);
      if (s.ok() && (n[0] < 0 || n[0] >= kMaxWorldSize)) s = Status::DataLoss("rank: out of range");
      if (!s.ok()) {
        Skip("files", "job=" + Printable(f.job) + " path=" + Printable(f.path), s);
        continue;
      }
      f.rank = static_cast<int32_t>(n[0]);
      f.size = static_cast<uint64_t>(n[1]);
      f.version = static_cast<uint64_t>(n[2]);
      f.created_unix_ns = n[3];
      f.committed_unix_ns = n[4];
      f.persisted_unix_ns = n[5];
      f.reason = Text(q, 11);
      f.owner_uid = static_cast<uid_t>(n[6]);
      f.owner_gid = static_cast<gid_t>(n[7]);
      out->push_back(std::move(f));
    }
    sqlite3_finalize(q);
    return rc == SQLITE_DONE ? Status::OK() : Fail("read files");
  }

  Status ApplyRing(const RingInfo& r) {
    sqlite3_stmt* q = nullptr;
    const std::string sql = schema::InsertSql(kDialect, "rings", {{"job"}, {"self"}, {"node_rank"}, {"endpoints"}},
                                              {"node_rank", "endpoints"});
    if (sqlite3_prepare_v2(db_, sql.c_str(), -1, &q, nullptr) != SQLITE_OK)
      return Fail("prepare ring");
    const std::string endpoints = EncodeEndpoints(r.endpoints);
    BindText(q, 1, r.job);
    BindText(q, 2, r.self);
    sqlite3_bind_int64(q, 3, r.node_rank);
    BindText(q, 4, endpoints);
    Status s = Step(q);
    sqlite3_finalize(q);
    return s;
  }

  Status LoadRings(const std::string& self, std::vector<RingInfo>* out) override {
    sqlite3_stmt* q = nullptr;
    if (sqlite3_prepare_v2(db_, "SELECT job, node_rank, endpoints FROM rings WHERE self = ? ORDER BY job",
                           -1, &q, nullptr) != SQLITE_OK)
      return Fail("select rings");
    BindText(q, 1, self);
    int rc;
    while ((rc = sqlite3_step(q)) == SQLITE_ROW) {
      RingInfo r;
      r.job = Text(q, 0);
      r.self = self;
      int64_t rank = 0;
      Status s = ValidateName("job", r.job, false, true);
      if (s.ok() && (!Int(q, 1, &rank) || rank < 0 || rank >= kMaxWorldSize))
        s = Status::DataLoss("node_rank: not a rank");
      if (s.ok()) s = DecodeEndpoints(Text(q, 2), &r.endpoints);
      if (!s.ok()) {
        Skip("rings", "job=" + Printable(r.job) + " self=" + Printable(self), s);
        continue;
      }
      r.node_rank = static_cast<int32_t>(rank);
      out->push_back(std::move(r));
    }
    sqlite3_finalize(q);
    return rc == SQLITE_DONE ? Status::OK() : Fail("read rings");
  }

  Status LoadTags(std::vector<TagInfo>* out) override {
    sqlite3_stmt* q = nullptr;
    if (sqlite3_prepare_v2(db_,
                           "SELECT job, tag, complete_ns, world_size, files, version, epoch FROM tags "
                           "WHERE complete_ns != 0 ORDER BY job, complete_ns, tag",
                           -1, &q, nullptr) != SQLITE_OK)
      return Fail("select tags");
    int rc;
    while ((rc = sqlite3_step(q)) == SQLITE_ROW) {
      TagInfo t;
      t.job = Text(q, 0);
      t.tag = Text(q, 1);
      int64_t world = 0;
      Status s;
      if (!Int(q, 2, &t.complete_unix_ns)) s = Status::DataLoss("complete_ns: not an integer");
      if (s.ok() && (!Int(q, 3, &world) || world < 1 || world > kMaxWorldSize))
        s = Status::DataLoss("world_size: not a world size");
      if (s.ok()) s = DecodeTagFiles(Text(q, 4), &t.files);
      int64_t version = 0;
      if (s.ok() && (!Int(q, 5, &version) || version < 0)) s = Status::DataLoss("version: not a version");
      t.version = static_cast<uint64_t>(version);
      int64_t epoch = 0;
      if (s.ok() && (!Int(q, 6, &epoch) || epoch < 0)) s = Status::DataLoss("epoch: not an epoch");
      t.epoch = static_cast<uint64_t>(epoch);
      if (s.ok()) s = CheckTag(t);
      if (!s.ok()) {
        Skip("tags", "job=" + Printable(t.job) + " tag=" + Printable(t.tag), s);
        continue;
      }
      t.world_size = static_cast<int32_t>(world);
      out->push_back(std::move(t));
    }
    sqlite3_finalize(q);
    return rc == SQLITE_DONE ? Status::OK() : Fail("read tags");
  }

  // DATA_LOSS when the files at the path are no longer the ones open;
  // FAILED_PRECONDITION (from then on, until the file is moved away) when
  // the database file was written by someone else in place (its size,
  // modification time or header are not what the last checkpoint left) or
  // SQLite found it damaged. One stat, one open and a 100-byte read.
  Status CheckIntact() override {
    struct stat db, wal;
    if (::stat(path_.c_str(), &db) != 0) return Status::DataLoss(path_ + " was deleted");
    if (db.st_dev != dev_ || db.st_ino != ino_) return Status::DataLoss(path_ + " was replaced");
    if (!untrusted_.ok()) return untrusted_;
    if (::stat((path_ + "-wal").c_str(), &wal) != 0) return Status::DataLoss(path_ + "-wal was deleted");
    if (wal.st_dev != wal_dev_ || wal.st_ino != wal_ino_) return Status::DataLoss(path_ + "-wal was replaced");
    FileMark now;  // the same file: its device and inode are checked above
    if (!ReadMark(fd_, &now)) return Status::Unavailable("sqlite: cannot read " + path_ + ": " + std::strerror(errno));
    const char* why = nullptr;
    if (std::memcmp(now.header, "SQLite format 3", 16) != 0)
      why = "its header is no longer SQLite's";
    else if (BigEndian32(now.header + 68) != kApplicationId)
      why = "its header no longer carries TCE's application_id";
    else if (now.size != mark_.size || now.mtime.tv_sec != mark_.mtime.tv_sec ||
             now.mtime.tv_nsec != mark_.mtime.tv_nsec || std::memcmp(now.header, mark_.header, kHeaderBytes) != 0)
      why = "another process wrote into it";
    if (why) return Distrust(path_ + " was overwritten in place (" + std::string(why) + ")");
    return untrusted_;
  }

  Status Reset() override {
    Close();  // checkpoints into the file it had open if trusted, whatever is at the path now
    struct stat st;
    if (::stat(path_.c_str(), &st) == 0 && (st.st_dev != dev_ || st.st_ino != ino_)) {
      // Someone else's file: keep it for them, start a fresh one.
      const std::string aside = path_ + ".replaced-" + std::to_string(Clock::Real()->UnixNowNs() / 1000000000);
      if (std::rename(path_.c_str(), aside.c_str()) != 0)
        return Status::FromErrno(errno, "rename " + path_ + " to " + aside);
      TCE_LOG(kWarning, "meta") << "moved the replacing file " << path_ << " aside to " << aside;
    }
    const size_t slash = path_.rfind('/');
    if (slash != std::string::npos && slash > 0) {  // the directory may be gone too
      Status s = Env::Default()->CreateDirs(path_.substr(0, slash));
      if (!s.ok()) return s;
    }
    return Open(path_);
  }

  Status Heartbeat(const std::string& endpoint, int64_t pid) override {
    if (!untrusted_.ok()) return untrusted_;
    sqlite3_stmt* q = nullptr;
    const std::string sql = schema::InsertSql(
        kDialect, "servers", {{"endpoint"}, {"pid"}, {"heartbeat_ns", kDialect.now_ns}}, {"pid", "heartbeat_ns"});
    if (sqlite3_prepare_v2(db_, sql.c_str(), -1, &q, nullptr) != SQLITE_OK)
      return Fail("prepare heartbeat");
    BindText(q, 1, endpoint);
    sqlite3_bind_int64(q, 2, pid);
    Status s = Step(q);
    sqlite3_finalize(q);
    if (s.ok()) MaybeCheckpoint();
    return s;
  }

 private:
  // Refuses, before anything is written, a file that SQLite cannot read,
  // one marked as another program's, or a SQLite database of tables that
  // are not TCE's; an empty file (a new database) and a TCE database from
  // before the mark pass.
  Status CheckOwnFile() {
    int64_t app = 0, tables = 0, ours = 0;
    Status s = QueryInt("PRAGMA application_id", &app);
    if (s.ok() && app != 0 && app != kApplicationId) {
      char hex[16];
      snprintf(hex, sizeof(hex), "%08llx", static_cast<unsigned long long>(app) & 0xffffffffULL);
      return Distrust(path_ + " is another program's SQLite database (application_id 0x" + hex + ")");
    }
    if (s.ok()) s = QueryInt("SELECT count(*) FROM sqlite_master WHERE type = 'table'", &tables);
    if (s.ok())
      s = QueryInt("SELECT count(*) FROM sqlite_master WHERE type = 'table' AND name = 'schema_version'", &ours);
    if (s.ok() && tables > 0 && ours == 0)
      return Distrust(path_ + " is a SQLite database of something else (it has tables, none of them TCE's)");
    // Every page, once, at start (later only what is read and the header).
    sqlite3_stmt* q = nullptr;
    if (s.ok() && sqlite3_prepare_v2(db_, "PRAGMA quick_check", -1, &q, nullptr) != SQLITE_OK) s = Fail("quick_check");
    if (s.ok()) {
      const int rc = sqlite3_step(q);
      if (rc == SQLITE_ROW && Text(q, 0) != "ok")
        s = Distrust(path_ + " is damaged (quick_check: " + Printable(Text(q, 0), 200) + ")");
      else if (rc != SQLITE_ROW && rc != SQLITE_DONE)
        s = Fail("quick_check");
    }
    sqlite3_finalize(q);
    return s;
  }

  Status QueryInt(const char* sql, int64_t* out) {
    sqlite3_stmt* q = nullptr;
    *out = 0;
    if (sqlite3_prepare_v2(db_, sql, -1, &q, nullptr) != SQLITE_OK) return Fail("read");
    const int rc = sqlite3_step(q);
    if (rc == SQLITE_ROW) *out = sqlite3_column_int64(q, 0);
    sqlite3_finalize(q);
    return rc == SQLITE_ROW || rc == SQLITE_DONE ? Status::OK() : Fail("read");
  }

  // From now on nothing is written to the database file (until Reset opens
  // another one); says so once, with what to do.
  Status Distrust(const std::string& what) {
    if (untrusted_.ok()) {
      untrusted_why_ = what;
      untrusted_ = Status::FailedPrecondition(what + ": " + RunningAdvice(path_));
    }
    return untrusted_;
  }

  static int WalHook(void* self, sqlite3*, const char*, int pages) {
    static_cast<SqliteStore*>(self)->wal_pages_ = pages;
    return SQLITE_OK;
  }

  // Copies a long WAL into the database file: the only write into that
  // file, done only while the file is still as the last one left it.
  void MaybeCheckpoint() {
    if (wal_pages_ < kCheckpointPages || !CheckIntact().ok()) return;
    wal_pages_ = 0;
    if (sqlite3_wal_checkpoint_v2(db_, nullptr, SQLITE_CHECKPOINT_PASSIVE, nullptr, nullptr) != SQLITE_OK)
      TCE_LOG(kWarning, "meta") << "sqlite checkpoint of " << path_ << ": " << sqlite3_errmsg(db_);
    if (!ReadMark(fd_, &mark_)) TCE_LOG(kWarning, "meta") << "cannot read " << path_ << " after a checkpoint";
  }

  Status ApplyTag(const TagInfo& t) {
    Bind(job_, {t.job});
    sqlite3_bind_int64(job_, 2, t.complete_unix_ns);
    Status s = Step(job_);
    if (!s.ok()) return s;
    Bind(done_, {t.job, t.tag});
    sqlite3_bind_int64(done_, 3, t.complete_unix_ns);
    sqlite3_bind_int64(done_, 4, t.complete_unix_ns);
    sqlite3_bind_int64(done_, 5, t.world_size);
    std::string files = EncodeTagFiles(t.files);
    BindText(done_, 6, files);
    sqlite3_bind_int64(done_, 7, static_cast<int64_t>(t.version));
    sqlite3_bind_int64(done_, 8, static_cast<int64_t>(t.epoch));
    return Step(done_);
  }

  // A column's bytes, whole (a TEXT value may hold any byte; NULL is "").
  static std::string Text(sqlite3_stmt* q, int i) {
    const unsigned char* t = sqlite3_column_text(q, i);
    return t ? std::string(reinterpret_cast<const char*>(t), static_cast<size_t>(sqlite3_column_bytes(q, i)))
             : std::string();
  }
  // An INTEGER column; false for any other type (SQLite keeps 'abc' as TEXT).
  static bool Int(sqlite3_stmt* q, int i, int64_t* out) {
    if (sqlite3_column_type(q, i) != SQLITE_INTEGER) return false;
    *out = sqlite3_column_int64(q, i);
    return true;
  }
  static void Skip(const char* table, const std::string& key, const Status& why) {
    TCE_LOG(kError, "meta") << "skipping a damaged row of table " << table << " (" << key
                            << "): " << why.message();
  }
  // SQLite finding the file damaged or not a database makes it untrusted;
  // anything else is UNAVAILABLE (retried).
  Status Fail(const std::string& what) {
    const int code = db_ ? sqlite3_errcode(db_) & 0xff : SQLITE_CANTOPEN;
    const std::string msg = db_ ? sqlite3_errmsg(db_) : "no database";
    if (code == SQLITE_NOTADB) return Distrust(path_ + " is not a SQLite database (sqlite " + what + ": " + msg + ")");
    if (code == SQLITE_CORRUPT) return Distrust(path_ + " is damaged (sqlite " + what + ": " + msg + ")");
    return Status::Unavailable("sqlite " + what + ": " + msg);
  }
  // schema::Connection
  Status Execute(const std::string& sql, bool /*migrating*/) override { return Exec(sql); }
  Status ReadVersion(int* version) override {
    sqlite3_stmt* q = nullptr;
    *version = 0;
    if (sqlite3_prepare_v2(db_, "SELECT MAX(version) FROM schema_version", -1, &q, nullptr) == SQLITE_OK &&
        sqlite3_step(q) == SQLITE_ROW)
      *version = sqlite3_column_int(q, 0);
    sqlite3_finalize(q);
    return Status::OK();
  }

  Status Exec(const std::string& sql) {
    char* err = nullptr;
    const int rc = sqlite3_exec(db_, sql.c_str(), nullptr, nullptr, &err);
    if (rc == SQLITE_OK) return Status::OK();
    std::string msg = err ? err : "error";
    sqlite3_free(err);
    if ((rc & 0xff) == SQLITE_NOTADB) return Distrust(path_ + " is not a SQLite database (sqlite: " + msg + ")");
    if ((rc & 0xff) == SQLITE_CORRUPT) return Distrust(path_ + " is damaged (sqlite: " + msg + ")");
    return Status::Unavailable(std::string("sqlite: ") + msg);
  }
  Status Prepare(sqlite3_stmt** s, const std::string& sql) {
    return sqlite3_prepare_v2(db_, sql.c_str(), -1, s, nullptr) == SQLITE_OK ? Status::OK() : Fail("prepare");
  }
  static void Bind(sqlite3_stmt* s, std::initializer_list<std::string> texts) {
    sqlite3_reset(s);
    sqlite3_clear_bindings(s);
    int i = 1;
    for (const std::string& t : texts) BindText(s, i++, t);
  }
  // Explicit lengths: a value is stored whole, whatever bytes it holds.
  static void BindText(sqlite3_stmt* s, int i, const std::string& t) {
    sqlite3_bind_text64(s, i, t.data(), t.size(), SQLITE_TRANSIENT, SQLITE_UTF8);
  }
  Status Step(sqlite3_stmt* s) {
    int rc = sqlite3_step(s);
    sqlite3_reset(s);
    return rc == SQLITE_DONE || rc == SQLITE_ROW ? Status::OK() : Fail("write");
  }

  // A trusted database file gets the WAL copied into it (SQLite's last
  // checkpoint). An untrusted one is left as it is, and its WAL (what this
  // server wrote on top of the file as it was, all of which a fresh
  // database gets again) is removed: replayed onto whatever the file is
  // now, it would make a mixture.
  void Close() {
    for (sqlite3_stmt** st : {&upsert_, &remove_, &job_, &tag_, &done_}) {
      sqlite3_finalize(*st);
      *st = nullptr;
    }
    if (!db_) return;
    const bool trusted = untrusted_.ok();
    if (!trusted) sqlite3_db_config(db_, SQLITE_DBCONFIG_NO_CKPT_ON_CLOSE, 1, nullptr);
    sqlite3_close(db_);
    db_ = nullptr;
    if (fd_ >= 0) ::close(fd_);  // after SQLite's locks are gone
    fd_ = -1;
    struct stat wal;
    const std::string wal_path = path_ + "-wal";
    if (!trusted && ::stat(wal_path.c_str(), &wal) == 0 && wal.st_dev == wal_dev_ && wal.st_ino == wal_ino_ &&
        ::unlink(wal_path.c_str()) != 0)
      TCE_LOG(kWarning, "meta") << "cannot remove " << wal_path << ": " << std::strerror(errno);
  }

  std::string path_;
  Status untrusted_;  // why the database file may not be written (OK: it may)
  std::string untrusted_why_;
  FileMark mark_;     // the file as the last checkpoint left it
  int wal_pages_ = 0;
  int fd_ = -1;       // the database file, read only; open while db_ is
  dev_t dev_ = 0, wal_dev_ = 0;
  ino_t ino_ = 0, wal_ino_ = 0;
  sqlite3* db_ = nullptr;
  sqlite3_stmt *upsert_ = nullptr, *remove_ = nullptr, *job_ = nullptr, *tag_ = nullptr,
               *done_ = nullptr;
};

}  // namespace

Status OpenSqliteStore(const std::string& path, std::unique_ptr<MetaStore>* out) {
  auto store = std::make_unique<SqliteStore>();
  Status s = store->Open(path);
  if (!s.ok() && !store->untrusted_why().empty())
    return Status::FailedPrecondition(store->untrusted_why() + "; the server does not start on it. " +
                                      StartAdvice(path));
  if (!s.ok()) return s;
  *out = std::move(store);
  return Status::OK();
}

}  // namespace tce
