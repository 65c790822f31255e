// The SQLite store and the database file it cannot trust: one deleted,
// replaced, overwritten in place or damaged is never written again (the
// changes stay queued) until it is moved aside; one that is not TCE's is
// refused and left as it is.
#include <gtest/gtest.h>
#include <sqlite3.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <iterator>

#include "common/testing.h"
#include "meta/meta_store.h"
#include "meta/meta_testing.h"
#include "meta/meta_writer.h"

namespace tce {
namespace {
namespace fs = std::filesystem;
using namespace std::chrono_literals;

TEST(SqliteStore, NoShmFileAndALostDatabaseIsNoticedAndReset) {
  std::string dir = MakeTempDir("tce-meta");
  std::string db = dir + "/tce.db";
  std::unique_ptr<MetaStore> store;
  ASSERT_TRUE(OpenMetaStore("sqlite://" + db, &store).ok());
  ASSERT_TRUE(store->Apply({MetaChange(File("/c/a.pt", FileState::kCached))}).ok());
  EXPECT_FALSE(fs::exists(db + "-shm"));  // the WAL index is in heap memory: nothing to SIGBUS on
  EXPECT_TRUE(store->CheckIntact().ok());
  fs::remove(db + "-wal");
  EXPECT_EQ(store->CheckIntact().message(), db + "-wal was deleted");
  ASSERT_TRUE(store->Reset().ok());
  EXPECT_TRUE(store->CheckIntact().ok());
  fs::remove_all(dir);  // the directory too: Reset makes it again
  Status s = store->CheckIntact();
  EXPECT_EQ(s.code(), Status::Code::kDataLoss);
  EXPECT_EQ(s.message(), db + " was deleted");
  ASSERT_TRUE(store->Reset().ok());
  ASSERT_TRUE(store->Apply({MetaChange(File("/c/b.pt", FileState::kCached))}).ok());
  std::vector<FileInfo> files;
  ASSERT_TRUE(store->LoadFiles(&files).ok());
  ASSERT_EQ(files.size(), 1u);  // a fresh database: the caller writes the full state again
  EXPECT_EQ(files[0].path, "/c/b.pt");
  fs::remove_all(dir);
}

std::string ReadAll(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

// Writes `bytes` at `offset` of the file in place (the same inode, as
// `dd conv=notrunc` does).
void Overwrite(const std::string& path, std::streamoff offset, const std::string& bytes) {
  std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
  f.seekp(offset);
  f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

std::string RunningAdvice(const std::string& db) {
  return ": nothing more is written to it and changes stay queued; move it aside (mv " + db + " " + db +
         ".broken) and the server writes everything it knows into a fresh database";
}

std::string StartAdvice(const std::string& db) {
  return "; the server does not start on it. Move it aside and start again: mv " + db + " " + db +
         ".broken (and mv " + db + "-wal " + db + "-wal.broken if it exists); the server then starts with "
         "empty metadata: files on storage still load from there, and a ring member gets its copies back "
         "from its successor once the job tells it the ring";
}

TEST(SqliteStore, ADatabaseOverwrittenInPlaceIsNeverWrittenAgain) {
  std::string dir = MakeTempDir("tce-meta");
  std::string db = dir + "/tce.db";
  std::unique_ptr<MetaStore> store;
  ASSERT_TRUE(OpenMetaStore("sqlite://" + db, &store).ok());
  ASSERT_TRUE(store->Apply({MetaChange(File("/c/a.pt", FileState::kCached))}).ok());
  ASSERT_TRUE(store->CheckIntact().ok());
  Overwrite(db, 0, std::string(4096, 'x'));
  const std::string written = ReadAll(db);
  Status s = store->CheckIntact();
  EXPECT_EQ(s.code(), Status::Code::kFailedPrecondition);
  EXPECT_EQ(s.message(), db + " was overwritten in place (its header is no longer SQLite's)" + RunningAdvice(db));
  EXPECT_EQ(store->Apply({MetaChange(File("/c/b.pt", FileState::kCached))}).message(), s.message());
  EXPECT_EQ(store->Heartbeat("/run/tce/tce.sock", 1).message(), s.message());
  EXPECT_EQ(store->CheckIntact().message(), s.message());  // it stays so
  store.reset();  // no last checkpoint into it, and the WAL (a mixture if replayed) goes
  EXPECT_EQ(ReadAll(db), written);
  EXPECT_FALSE(fs::exists(db + "-wal"));
  s = OpenMetaStore("sqlite://" + db, &store);
  EXPECT_EQ(s.code(), Status::Code::kFailedPrecondition);
  EXPECT_EQ(s.message(), db + " is not a SQLite database (sqlite read: file is not a database)" + StartAdvice(db));
  EXPECT_EQ(ReadAll(db), written);
  fs::rename(db, db + ".broken");  // what the advice says
  ASSERT_TRUE(OpenMetaStore("sqlite://" + db, &store).ok());
  fs::remove_all(dir);
}

TEST(SqliteStore, AWriteAnywhereInTheFileIsNoticedAndMovingItAsideResets) {
  std::string dir = MakeTempDir("tce-meta");
  std::string db = dir + "/tce.db";
  std::unique_ptr<MetaStore> store;
  ASSERT_TRUE(OpenMetaStore("sqlite://" + db, &store).ok());
  ASSERT_TRUE(store->Apply({MetaChange(File("/c/a.pt", FileState::kCached))}).ok());
  ASSERT_GT(fs::file_size(db), 4096u);
  // Until the filesystem's clock has moved past the file's time, so that a
  // write now gives it another one.
  const auto left = fs::last_write_time(db);
  ASSERT_TRUE(Eventually([&] {
    std::ofstream(dir + "/probe") << "x";
    return fs::last_write_time(dir + "/probe") > left;
  }));
  Overwrite(db, 4096, "a page that is not the header");
  const std::string written = ReadAll(db);
  Status s = store->CheckIntact();
  EXPECT_EQ(s.code(), Status::Code::kFailedPrecondition);
  EXPECT_EQ(s.message(), db + " was overwritten in place (another process wrote into it)" + RunningAdvice(db));
  fs::rename(db, db + ".broken");
  s = store->CheckIntact();
  EXPECT_EQ(s.code(), Status::Code::kDataLoss);
  EXPECT_EQ(s.message(), db + " was deleted");
  ASSERT_TRUE(store->Reset().ok());
  EXPECT_TRUE(store->CheckIntact().ok());
  ASSERT_TRUE(store->Apply({MetaChange(File("/c/b.pt", FileState::kCached))}).ok());
  std::vector<FileInfo> files;
  ASSERT_TRUE(store->LoadFiles(&files).ok());
  ASSERT_EQ(files.size(), 1u);  // a fresh database, trusted again
  EXPECT_EQ(files[0].path, "/c/b.pt");
  EXPECT_EQ(ReadAll(db + ".broken"), written);
  fs::remove_all(dir);
}

TEST(SqliteStore, RefusesWhatIsNotATceDatabaseAndLeavesItAlone) {
  std::string dir = MakeTempDir("tce-meta");
  std::string db = dir + "/tce.db";
  auto make = [&](const char* sql) {
    fs::remove(db);
    sqlite3* h;
    ASSERT_EQ(sqlite3_open(db.c_str(), &h), SQLITE_OK);
    ASSERT_EQ(sqlite3_exec(h, sql, nullptr, nullptr, nullptr), SQLITE_OK);
    sqlite3_close(h);
  };
  const std::pair<const char*, std::string> cases[] = {
      {"CREATE TABLE t (x); INSERT INTO t VALUES (1);",
       " is a SQLite database of something else (it has tables, none of them TCE's)"},
      {"PRAGMA application_id = 42;", " is another program's SQLite database (application_id 0x0000002a)"},
  };
  for (const auto& [sql, why] : cases) {
    make(sql);
    const std::string before = ReadAll(db);
    std::unique_ptr<MetaStore> store;
    Status s = OpenMetaStore("sqlite://" + db, &store);
    EXPECT_EQ(s.code(), Status::Code::kFailedPrecondition);
    EXPECT_EQ(s.message(), db + why + StartAdvice(db));
    EXPECT_EQ(ReadAll(db), before);
    EXPECT_FALSE(fs::exists(db + "-wal"));
  }
  fs::remove_all(dir);
}

TEST(SqliteStore, RefusesADamagedDatabaseAtOpen) {
  std::string dir = MakeTempDir("tce-meta");
  std::string db = dir + "/tce.db";
  {
    std::unique_ptr<MetaStore> store;
    ASSERT_TRUE(OpenMetaStore("sqlite://" + db, &store).ok());
    ASSERT_TRUE(store->Apply({MetaChange(File("/c/a.pt", FileState::kCached))}).ok());
  }
  const size_t size = fs::file_size(db);
  ASSERT_GT(size, 4096u);
  Overwrite(db, 4096, std::string(size - 4096, '\x5a'));  // every page but the header's
  std::unique_ptr<MetaStore> store;
  Status s = OpenMetaStore("sqlite://" + db, &store);
  EXPECT_EQ(s.code(), Status::Code::kFailedPrecondition);
  EXPECT_EQ(s.message().rfind(db + " is damaged (", 0), 0u) << s.message();
  EXPECT_NE(s.message().find(StartAdvice(db)), std::string::npos) << s.message();
  fs::remove_all(dir);
}

TEST(SqliteStore, ItsOwnCheckpointsAreNotMistakenForAnOverwrite) {
  std::string dir = MakeTempDir("tce-meta");
  std::string db = dir + "/tce.db";
  std::unique_ptr<MetaStore> store;
  ASSERT_TRUE(OpenMetaStore("sqlite://" + db, &store).ok());
  const auto size = fs::file_size(db);
  // Until the WAL has been copied into the file (it grows), and a while after.
  int after = 0;
  for (int i = 0; i < 20000 && after < 50; ++i) {
    FileInfo f = File("/c/" + std::to_string(i) + ".pt", FileState::kCached);
    f.reason = std::string(2000, 'r');  // about a page a file
    ASSERT_TRUE(store->Apply({MetaChange(f)}).ok());
    ASSERT_TRUE(store->CheckIntact().ok()) << i;
    if (fs::file_size(db) > size) ++after;
  }
  EXPECT_EQ(after, 50);
  fs::remove_all(dir);
}

TEST(MetaWriter, KeepsChangesQueuedWhileTheDatabaseIsUntrusted) {
  std::string dir = MakeTempDir("tce-metaw");
  std::string db = dir + "/tce.db";
  std::unique_ptr<MetaStore> store;
  ASSERT_TRUE(OpenMetaStore("sqlite://" + db, &store).ok());
  std::atomic<int> resyncs{0};
  MetaWriter writer(std::move(store), "", 0, 10s, 200ms, 20ms);
  writer.SetResync([&] {
    ++resyncs;
    writer.Record(File("/c/a.pt", FileState::kCached), false);  // what the cache holds
  });
  writer.Start();
  writer.Record(File("/c/a.pt", FileState::kCached), false);
  ASSERT_TRUE(Eventually([&] { return writer.Status().written == 1; }));
  Overwrite(db, 0, std::string(100, 'x'));
  const std::string written = ReadAll(db);
  ASSERT_TRUE(Eventually([&] { return !writer.Status().healthy; }));
  writer.Record(File("/c/b.pt", FileState::kCached), false);
  MetaStatus st = writer.Status();
  EXPECT_EQ(st.last_error, db + " was overwritten in place (its header is no longer SQLite's)" + RunningAdvice(db));
  EXPECT_EQ(st.queued, 1u);
  EXPECT_EQ(ReadAll(db), written);
  fs::rename(db, db + ".broken");  // what the error says to do
  ASSERT_TRUE(Eventually([&] { return writer.Status().healthy && writer.Status().queued == 0; }));
  EXPECT_EQ(resyncs.load(), 1);
  writer.Stop();
  EXPECT_EQ(ReadAll(db + ".broken"), written);
  fs::remove_all(dir);
}

}  // namespace
}  // namespace tce
