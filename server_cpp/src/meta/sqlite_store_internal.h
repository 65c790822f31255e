// SqliteStore, the SQLite MetaStore (meta/sqlite_store.h), as the files that
// define it share it: sqlite_store.cc (the database file) and sqlite_rows.cc
// (the rows). Nothing else includes this.
#pragma once

#include <sqlite3.h>
#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <ctime>
#include <initializer_list>
#include <string>
#include <vector>

#include "meta/meta_store.h"
#include "meta/schema.h"

namespace tce {
namespace sqlite {

inline const schema::Dialect& kDialect = schema::kSqlite;

constexpr size_t kHeaderBytes = 100;

// The database file as the store last left it: between the store's own
// checkpoints nothing else writes it, so any change is someone else's.
struct FileMark {
  off_t size = 0;
  timespec mtime{};
  unsigned char header[kHeaderBytes] = {};
};

class SqliteStore final : public MetaStore, private schema::Connection {
 public:
  // What is wrong with the database file, with no advice ("" when nothing).
  const std::string& untrusted_why() const { return untrusted_why_; }
  // Checkpoints into the database file only if it is still as it was left.
  ~SqliteStore() override;

  // FAILED_PRECONDITION when the file at `path` is not a TCE database
  // (not SQLite, damaged, or another program's): nothing is written to it.
  Status Open(const std::string& path);

  // A file's new state: its job and tag rows, then its own.
  Status ApplyFile(const FileInfo& f);
  Status Apply(const std::vector<MetaChange>& batch) override;
  // A row that fails its checks is logged (table and key) and skipped: a
  // damaged database costs that row, never the server.
  Status LoadFiles(std::vector<FileInfo>* out) override;
  Status ApplyRing(const RingInfo& r);
  Status LoadRings(const std::string& self, std::vector<RingInfo>* out) override;
  Status LoadTags(std::vector<TagInfo>* out) override;

  // DATA_LOSS when the files at the path are no longer the ones open;
  // FAILED_PRECONDITION (from then on, until the file is moved away) when
  // the database file was written by someone else in place (its size,
  // modification time or header are not what the last checkpoint left) or
  // SQLite found it damaged. One stat, one open and a 100-byte read.
  Status CheckIntact() override;
  Status Reset() override;
  Status Heartbeat(const std::string& endpoint, int64_t pid) override;

 private:
  // Refuses, before anything is written, a file that SQLite cannot read,
  // one marked as another program's, or a SQLite database of tables that
  // are not TCE's; an empty file (a new database) and a TCE database from
  // before the mark pass.
  Status CheckOwnFile();
  Status QueryInt(const char* sql, int64_t* out);
  // From now on nothing is written to the database file (until Reset opens
  // another one); says so once, with what to do.
  Status Distrust(const std::string& what);
  static int WalHook(void* self, sqlite3*, const char*, int pages);
  // Copies a long WAL into the database file: the only write into that
  // file, done only while the file is still as the last one left it.
  void MaybeCheckpoint();
  Status ApplyTag(const TagInfo& t);

  // A column's bytes, whole (a TEXT value may hold any byte; NULL is "").
  static std::string Text(sqlite3_stmt* q, int i);
  // An INTEGER column; false for any other type (SQLite keeps 'abc' as TEXT).
  static bool Int(sqlite3_stmt* q, int i, int64_t* out);
  static void Skip(const char* table, const std::string& key, const Status& why);
  // SQLite finding the file damaged or not a database makes it untrusted;
  // anything else is UNAVAILABLE (retried).
  Status Fail(const std::string& what);
  // schema::Connection
  Status Execute(const std::string& sql, bool /*migrating*/) override { return Exec(sql); }
  Status ReadVersion(int* version) override;

  Status Exec(const std::string& sql);
  Status Prepare(sqlite3_stmt** s, const std::string& sql);
  static void Bind(sqlite3_stmt* s, std::initializer_list<std::string> texts);
  // Explicit lengths: a value is stored whole, whatever bytes it holds.
  static void BindText(sqlite3_stmt* s, int i, const std::string& t);
  Status Step(sqlite3_stmt* s);

  // A trusted database file gets the WAL copied into it (SQLite's last
  // checkpoint). An untrusted one is left as it is, and its WAL (what this
  // server wrote on top of the file as it was, all of which a fresh
  // database gets again) is removed: replayed onto whatever the file is
  // now, it would make a mixture.
  void Close();

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

}  // namespace sqlite
}  // namespace tce
