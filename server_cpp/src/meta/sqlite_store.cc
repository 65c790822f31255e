// MetaStore on an embedded SQLite file: sqlite:///abs/path.db. Here the
// database file: opened, checked, checkpointed and closed; the rows:
// sqlite_rows.cc.
#include <fcntl.h>
#include <sqlite3.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

#include "common/clock.h"
#include "common/logging.h"
#include "env/env.h"
#include "meta/row_codec.h"
#include "meta/sqlite_store.h"
#include "meta/sqlite_store_internal.h"

namespace tce {
namespace sqlite {
namespace {

// TCE's mark in the database header (PRAGMA application_id): "TCE1".
constexpr int64_t kApplicationId = 0x54434531;
// The WAL is copied into the database file (checkpointed) once it holds
// this many pages; SQLite's own automatic checkpoints are off.
constexpr int kCheckpointPages = 1000;

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

}  // namespace

SqliteStore::~SqliteStore() {
  Status intact = db_ ? CheckIntact() : Status::OK();
  (void)intact;
  Close();
}

Status SqliteStore::Open(const std::string& path) {
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

Status SqliteStore::CheckIntact() {
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

Status SqliteStore::Reset() {
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

Status SqliteStore::CheckOwnFile() {
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

Status SqliteStore::QueryInt(const char* sql, int64_t* out) {
  sqlite3_stmt* q = nullptr;
  *out = 0;
  if (sqlite3_prepare_v2(db_, sql, -1, &q, nullptr) != SQLITE_OK) return Fail("read");
  const int rc = sqlite3_step(q);
  if (rc == SQLITE_ROW) *out = sqlite3_column_int64(q, 0);
  sqlite3_finalize(q);
  return rc == SQLITE_ROW || rc == SQLITE_DONE ? Status::OK() : Fail("read");
}

Status SqliteStore::Distrust(const std::string& what) {
  if (untrusted_.ok()) {
    untrusted_why_ = what;
    untrusted_ = Status::FailedPrecondition(what + ": " + RunningAdvice(path_));
  }
  return untrusted_;
}

int SqliteStore::WalHook(void* self, sqlite3*, const char*, int pages) {
  static_cast<SqliteStore*>(self)->wal_pages_ = pages;
  return SQLITE_OK;
}

void SqliteStore::MaybeCheckpoint() {
  if (wal_pages_ < kCheckpointPages || !CheckIntact().ok()) return;
  wal_pages_ = 0;
  if (sqlite3_wal_checkpoint_v2(db_, nullptr, SQLITE_CHECKPOINT_PASSIVE, nullptr, nullptr) != SQLITE_OK)
    TCE_LOG(kWarning, "meta") << "sqlite checkpoint of " << path_ << ": " << sqlite3_errmsg(db_);
  if (!ReadMark(fd_, &mark_)) TCE_LOG(kWarning, "meta") << "cannot read " << path_ << " after a checkpoint";
}

Status SqliteStore::Fail(const std::string& what) {
  const int code = db_ ? sqlite3_errcode(db_) & 0xff : SQLITE_CANTOPEN;
  const std::string msg = db_ ? sqlite3_errmsg(db_) : "no database";
  if (code == SQLITE_NOTADB) return Distrust(path_ + " is not a SQLite database (sqlite " + what + ": " + msg + ")");
  if (code == SQLITE_CORRUPT) return Distrust(path_ + " is damaged (sqlite " + what + ": " + msg + ")");
  return Status::Unavailable("sqlite " + what + ": " + msg);
}

Status SqliteStore::ReadVersion(int* version) {
  sqlite3_stmt* q = nullptr;
  *version = 0;
  if (sqlite3_prepare_v2(db_, "SELECT MAX(version) FROM schema_version", -1, &q, nullptr) == SQLITE_OK &&
      sqlite3_step(q) == SQLITE_ROW)
    *version = sqlite3_column_int(q, 0);
  sqlite3_finalize(q);
  return Status::OK();
}

Status SqliteStore::Exec(const std::string& sql) {
  char* err = nullptr;
  const int rc = sqlite3_exec(db_, sql.c_str(), nullptr, nullptr, &err);
  if (rc == SQLITE_OK) return Status::OK();
  std::string msg = err ? err : "error";
  sqlite3_free(err);
  if ((rc & 0xff) == SQLITE_NOTADB) return Distrust(path_ + " is not a SQLite database (sqlite: " + msg + ")");
  if ((rc & 0xff) == SQLITE_CORRUPT) return Distrust(path_ + " is damaged (sqlite: " + msg + ")");
  return Status::Unavailable(std::string("sqlite: ") + msg);
}

Status SqliteStore::Prepare(sqlite3_stmt** s, const std::string& sql) {
  return sqlite3_prepare_v2(db_, sql.c_str(), -1, s, nullptr) == SQLITE_OK ? Status::OK() : Fail("prepare");
}

void SqliteStore::Close() {
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

}  // namespace sqlite

Status OpenSqliteStore(const std::string& path, std::unique_ptr<MetaStore>* out) {
  auto store = std::make_unique<sqlite::SqliteStore>();
  Status s = store->Open(path);
  if (!s.ok() && !store->untrusted_why().empty())
    return Status::FailedPrecondition(store->untrusted_why() + "; the server does not start on it. " +
                                      sqlite::StartAdvice(path));
  if (!s.ok()) return s;
  *out = std::move(store);
  return Status::OK();
}

}  // namespace tce
