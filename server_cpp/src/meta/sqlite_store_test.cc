#include <gtest/gtest.h>
#include <sqlite3.h>

#include <filesystem>
#include <thread>

#include "common/testing.h"
#include "meta/meta_store.h"
#include "meta/mysql_store.h"
#include "meta/meta_writer.h"

namespace tce {
namespace {
namespace fs = std::filesystem;
using namespace std::chrono_literals;

FileInfo File(const std::string& path, FileState state, const std::string& tag = "step1") {
  FileInfo f;
  f.job = "job";
  f.tag = tag;
  f.path = path;
  f.rank = 3;
  f.size = 4242;
  f.state = state;
  f.version = 17;
  f.committed_unix_ns = 1000;
  f.owner_uid = 1000;
  f.owner_gid = 100;
  f.records = {{"we;ird,name\nx/data/0", 0, 64, 100, 0, 300}, {"x/version", 200, 256, 2, 7, 360}};
  f.records[0].crc32 = 0xdeadbeef;
  return f;
}

int Count(const std::string& db, const char* sql) {
  sqlite3* h;
  sqlite3_open(db.c_str(), &h);
  sqlite3_stmt* q;
  sqlite3_prepare_v2(h, sql, -1, &q, nullptr);
  int n = sqlite3_step(q) == SQLITE_ROW ? sqlite3_column_int(q, 0) : -1;
  sqlite3_finalize(q);
  sqlite3_close(h);
  return n;
}

TEST(SqliteStore, RoundTripAndIdempotentSchema) {
  std::string dir = MakeTempDir("tce-meta");
  std::string url = "sqlite://" + dir + "/tce.db";
  {
    std::unique_ptr<MetaStore> store;
    ASSERT_TRUE(OpenMetaStore(url, &store).ok());
    ASSERT_TRUE(store->Apply({{File("/c/a.pt", FileState::kCached), false},
                              {File("/c/b.pt", FileState::kPersisted, "step2"), false}}).ok());
    FileInfo failed = File("/c/a.pt", FileState::kFailed);
    failed.reason = "INTERNAL: write: Input/output error";
    ASSERT_TRUE(store->Apply({{failed, false}}).ok());  // upsert
    ASSERT_TRUE(store->Heartbeat("/run/tce/tce.sock", 99).ok());
  }
  std::unique_ptr<MetaStore> again;  // reopening applies the schema again, harmlessly
  ASSERT_TRUE(OpenMetaStore(url, &again).ok());
  std::vector<FileInfo> files;
  ASSERT_TRUE(again->LoadFiles(&files).ok());
  ASSERT_EQ(files.size(), 2u);
  EXPECT_EQ(files[0].path, "/c/a.pt");
  EXPECT_EQ(files[0].state, FileState::kFailed);
  EXPECT_EQ(files[0].reason, "INTERNAL: write: Input/output error");
  EXPECT_EQ(files[0].owner_uid, 1000u);
  ASSERT_EQ(files[0].records.size(), 2u);
  EXPECT_EQ(files[0].records[0].name, "we;ird,name\nx/data/0");
  EXPECT_EQ(files[0].records[0].crc32, 0xdeadbeefu);
  EXPECT_EQ(files[0].records[1].central_offset, 360u);
  EXPECT_EQ(files[1].state, FileState::kPersisted);
  ASSERT_TRUE(again->Apply({{File("/c/b.pt", FileState::kPersisted), true}}).ok());  // removed
  files.clear();
  ASSERT_TRUE(again->LoadFiles(&files).ok());
  EXPECT_EQ(files.size(), 1u);
  again.reset();
  std::string db = dir + "/tce.db";
  EXPECT_EQ(Count(db, "SELECT COUNT(*) FROM schema_version"), 1);
  EXPECT_EQ(Count(db, "SELECT MAX(version) FROM schema_version"), MetaStore::kSchemaVersion);
  EXPECT_EQ(Count(db, "SELECT COUNT(*) FROM tags WHERE job='job'"), 2);
  EXPECT_EQ(Count(db, "SELECT COUNT(*) FROM jobs"), 1);
  EXPECT_EQ(Count(db, "SELECT pid FROM servers"), 99);
  fs::remove_all(dir);
}

TEST(SqliteStore, BadUrls) {
  std::unique_ptr<MetaStore> s;
  EXPECT_EQ(OpenMetaStore("sqlite://relative.db", &s).code(), Status::Code::kInvalidArgument);
  EXPECT_EQ(OpenMetaStore("postgres://u@h/db", &s).code(), Status::Code::kUnimplemented);
  EXPECT_EQ(OpenMetaStore("mysql://u@h", &s).code(), Status::Code::kInvalidArgument);
  MysqlUrl u;
  ASSERT_TRUE(ParseMysqlUrl("mysql://tce:p@ss:w@127.0.0.1:3307/ckpt", &u).ok());
  EXPECT_EQ(u.user, "tce");
  EXPECT_EQ(u.password, "p@ss:w");
  EXPECT_EQ(u.host, "127.0.0.1");
  EXPECT_EQ(u.port, 3307u);
  EXPECT_EQ(u.database, "ckpt");
  EXPECT_EQ(RedactUrl("mysql://tce:p@ss:w@127.0.0.1:3307/ckpt"), "mysql://tce:***@127.0.0.1:3307/ckpt");
  EXPECT_EQ(RedactUrl("mysql://tce@h/db"), "mysql://tce@h/db");
  EXPECT_EQ(RedactUrl("sqlite:///var/lib/tce/tce.db"), "sqlite:///var/lib/tce/tce.db");
  EXPECT_FALSE(OpenMetaStore("sqlite:///nonexistent-dir/x/tce.db", &s).ok());
}

TEST(MetaWriter, QueuesThroughAnOutageAndCatchesUp) {
  std::string dir = MakeTempDir("tce-metaw");
  std::string db = dir + "/tce.db";
  std::unique_ptr<MetaStore> store;
  ASSERT_TRUE(OpenMetaStore("sqlite://" + db, &store).ok());
  // Another connection holds the write lock: the store is "down".
  sqlite3* blocker;
  sqlite3_open(db.c_str(), &blocker);
  sqlite3_exec(blocker, "BEGIN IMMEDIATE", nullptr, nullptr, nullptr);
  MetaWriter writer(std::move(store), "", 0, 10s, 200ms);
  writer.Start();
  for (int i = 0; i < 5; ++i) writer.Record(File("/c/f" + std::to_string(i) + ".pt", FileState::kCached), false);
  writer.Record(File("/c/f0.pt", FileState::kPersisted), false);  // coalesces with f0
  for (int i = 0; i < 200 && writer.Status().healthy; ++i) std::this_thread::sleep_for(50ms);
  MetaStatus st = writer.Status();
  EXPECT_FALSE(st.healthy);
  EXPECT_EQ(st.queued, 5u);
  EXPECT_NE(st.last_error.find("locked"), std::string::npos) << st.last_error;
  sqlite3_exec(blocker, "ROLLBACK", nullptr, nullptr, nullptr);  // the store comes back
  sqlite3_close(blocker);
  for (int i = 0; i < 400 && !writer.Status().healthy; ++i) std::this_thread::sleep_for(50ms);
  writer.Stop();
  EXPECT_TRUE(writer.Status().healthy);
  EXPECT_EQ(writer.Status().queued, 0u);
  EXPECT_EQ(Count(db, "SELECT COUNT(*) FROM files"), 5);
  EXPECT_EQ(Count(db, "SELECT COUNT(*) FROM files WHERE state='PERSISTED'"), 1);
  fs::remove_all(dir);
}

TEST(MetaWriter, HeartbeatsWhileIdle) {
  std::string dir = MakeTempDir("tce-metahb");
  std::string db = dir + "/tce.db";
  std::unique_ptr<MetaStore> store;
  ASSERT_TRUE(OpenMetaStore("sqlite://" + db, &store).ok());
  MetaWriter writer(std::move(store), "/run/tce/tce.sock", 4321, 50ms);
  writer.Start();
  std::this_thread::sleep_for(300ms);
  int first = Count(db, "SELECT heartbeat_ns % 1000000000 FROM servers");
  std::this_thread::sleep_for(300ms);
  writer.Stop();
  EXPECT_EQ(Count(db, "SELECT pid FROM servers WHERE endpoint = '/run/tce/tce.sock'"), 4321);
  EXPECT_NE(Count(db, "SELECT heartbeat_ns % 1000000000 FROM servers"), first);  // it beat again
  fs::remove_all(dir);
}

}  // namespace
}  // namespace tce
