// The SQLite store's rows: files, tags and rings round trip whole, a
// version 1 database migrates, a damaged row costs only itself; the
// MetaWriter over it. The database file it cannot trust: sqlite_trust_test.cc.
#include <gtest/gtest.h>
#include <sqlite3.h>

#include <atomic>
#include <filesystem>
#include <functional>
#include <thread>

#include "common/manual_clock.h"
#include "common/testing.h"
#include "meta/meta_store.h"
#include "meta/meta_testing.h"
#include "meta/meta_writer.h"

namespace tce {
namespace {
namespace fs = std::filesystem;
using namespace std::chrono_literals;

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
    ASSERT_TRUE(store->Apply({MetaChange(File("/c/a.pt", FileState::kCached)),
                              MetaChange(File("/c/b.pt", FileState::kPersisted, "step2"))}).ok());
    FileInfo failed = File("/c/a.pt", FileState::kFailed);
    failed.reason = "INTERNAL: write: Input/output error";
    ASSERT_TRUE(store->Apply({failed}).ok());  // upsert
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
  ASSERT_TRUE(again->Apply({FileRemoved{"job", "/c/b.pt"}}).ok());  // removed
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

// A real store behind a switch that makes it fail like an unreachable
// database (test-only fault injection at the MetaStore interface).
class FlakyStore final : public MetaStore {
 public:
  explicit FlakyStore(std::unique_ptr<MetaStore> real) : real_(std::move(real)) {}
  std::atomic<bool> down{false};
  Status Apply(const std::vector<MetaChange>& b) override { return down ? Down() : real_->Apply(b); }
  Status LoadFiles(std::vector<FileInfo>* out) override { return real_->LoadFiles(out); }
  Status LoadTags(std::vector<TagInfo>* out) override { return real_->LoadTags(out); }
  Status LoadRings(const std::string& self, std::vector<RingInfo>* out) override {
    return real_->LoadRings(self, out);
  }
  std::atomic<int> beats{0};
  Status Heartbeat(const std::string& e, int64_t pid) override {
    ++beats;
    return down ? Down() : real_->Heartbeat(e, pid);
  }
  Status CheckIntact() override { return real_->CheckIntact(); }
  Status Reset() override { return real_->Reset(); }

 private:
  static Status Down() { return Status::Unavailable("sqlite write: database is locked"); }
  std::unique_ptr<MetaStore> real_;
};

TEST(MetaWriter, QueuesThroughAnOutageAndCatchesUp) {
  std::string dir = MakeTempDir("tce-metaw");
  std::string db = dir + "/tce.db";
  std::unique_ptr<MetaStore> real;
  ASSERT_TRUE(OpenMetaStore("sqlite://" + db, &real).ok());
  auto flaky = std::make_unique<FlakyStore>(std::move(real));
  FlakyStore* store = flaky.get();
  store->down = true;  // the store is "down"
  auto owned = std::make_unique<MetaWriter>(std::move(flaky), "", 0, 10s, 200ms);
  MetaWriter& writer = *owned;
  writer.Start();
  for (int i = 0; i < 5; ++i) writer.Record(File("/c/f" + std::to_string(i) + ".pt", FileState::kCached), false);
  writer.Record(File("/c/f0.pt", FileState::kPersisted), false);  // coalesces with f0
  for (int i = 0; i < 200 && writer.Status().healthy; ++i) std::this_thread::sleep_for(50ms);
  MetaStatus st = writer.Status();
  EXPECT_FALSE(st.healthy);
  EXPECT_EQ(st.queued, 5u);
  EXPECT_NE(st.last_error.find("locked"), std::string::npos) << st.last_error;
  store->down = false;  // the store comes back
  for (int i = 0; i < 400 && !writer.Status().healthy; ++i) std::this_thread::sleep_for(50ms);
  writer.Stop();
  EXPECT_TRUE(writer.Status().healthy);
  EXPECT_EQ(writer.Status().queued, 0u);
  owned.reset();  // closes the store, which holds its database exclusively
  EXPECT_EQ(Count(db, "SELECT COUNT(*) FROM files"), 5);
  EXPECT_EQ(Count(db, "SELECT COUNT(*) FROM files WHERE state='PERSISTED'"), 1);
  fs::remove_all(dir);
}

TEST(MetaWriter, HeartbeatsWhileIdle) {
  std::string dir = MakeTempDir("tce-metahb");
  std::string db = dir + "/tce.db";
  std::unique_ptr<MetaStore> real;
  ASSERT_TRUE(OpenMetaStore("sqlite://" + db, &real).ok());
  auto counted = std::make_unique<FlakyStore>(std::move(real));
  FlakyStore* store = counted.get();
  {
    ManualClock clock;
    MetaWriter writer(std::move(counted), "/run/tce/tce.sock", 4321, 50ms, 30s, 1s, &clock);
    writer.Start();
    ASSERT_TRUE(Eventually([&] { return store->beats.load() == 1; }));  // at once
    for (int beat = 2; beat <= 4; ++beat) {  // then one per interval, while nothing else happens
      clock.Advance(50ms);
      ASSERT_TRUE(Eventually([&] { return store->beats.load() == beat; }));
    }
    writer.Stop();
  }
  EXPECT_EQ(Count(db, "SELECT pid FROM servers WHERE endpoint = '/run/tce/tce.sock'"), 4321);
  EXPECT_EQ(Count(db, "SELECT heartbeat_ns > 0 FROM servers"), 1);
  fs::remove_all(dir);
}

MetaChange TagChange(const std::string& tag, int64_t when, std::vector<TagFile> files,
                     uint64_t version = 0, uint64_t epoch = 0) {
  TagInfo t;
  t.version = version;
  t.epoch = epoch;
  t.job = "job";
  t.tag = tag;
  t.complete_unix_ns = when;
  t.world_size = 2;
  t.files = std::move(files);
  return t;
}

TEST(SqliteStore, TagsRoundTripWithAnyPath) {
  std::string dir = MakeTempDir("tce-meta");
  std::string url = "sqlite://" + dir + "/tce.db";
  // Separators of the column format inside the path (control characters
  // never reach a tag: the service refuses them).
  const std::string odd = "/c/we ird: 3 name 12:x.pt";
  {
    std::unique_ptr<MetaStore> store;
    ASSERT_TRUE(OpenMetaStore(url, &store).ok());
    ASSERT_TRUE(store->Apply({MetaChange(File("/c/a.pt", FileState::kCached, "step2")),
                              TagChange("step2", 2000, {{0, "/c/a.pt", 4242}, {1, odd, 7}}, /*version=*/9,
                                        /*epoch=*/(uint64_t{1} << 62) + 5),
                              TagChange("step1", 1000, {{0, "/c/old.pt", 1}})}).ok());
  }
  std::unique_ptr<MetaStore> again;
  ASSERT_TRUE(OpenMetaStore(url, &again).ok());
  std::vector<TagInfo> tags;
  ASSERT_TRUE(again->LoadTags(&tags).ok());
  ASSERT_EQ(tags.size(), 2u);
  EXPECT_EQ(tags[0].tag, "step1");
  EXPECT_EQ(tags[1].tag, "step2");
  EXPECT_EQ(tags[1].complete_unix_ns, 2000);
  EXPECT_EQ(tags[1].world_size, 2);
  EXPECT_EQ(tags[1].version, 9u);
  EXPECT_EQ(tags[1].epoch, (uint64_t{1} << 62) + 5);
  EXPECT_EQ(tags[0].version, 0u);
  EXPECT_EQ(tags[0].epoch, 0u);
  ASSERT_EQ(tags[1].files.size(), 2u);
  EXPECT_EQ(tags[1].files[1].path, odd);
  EXPECT_EQ(tags[1].files[1].rank, 1);
  EXPECT_EQ(tags[1].files[1].size, 7u);
  // a tag that only has files (no completion) is not loaded as complete
  ASSERT_TRUE(again->Apply({MetaChange(File("/c/x.pt", FileState::kCached, "step3"))}).ok());
  tags.clear();
  ASSERT_TRUE(again->LoadTags(&tags).ok());
  EXPECT_EQ(tags.size(), 2u);
  again.reset();  // the store holds its database exclusively while open
  EXPECT_EQ(Count(dir + "/tce.db", "SELECT COUNT(*) FROM tags"), 3);
  fs::remove_all(dir);
}

TEST(SqliteStore, MigratesAVersion1Database) {
  std::string dir = MakeTempDir("tce-meta");
  std::string db = dir + "/tce.db";
  {  // the schema as version 1 created it, with data
    sqlite3* h;
    ASSERT_EQ(sqlite3_open(db.c_str(), &h), SQLITE_OK);
    const char* v1 =
        "CREATE TABLE schema_version (version INTEGER NOT NULL);"
        "INSERT INTO schema_version VALUES (1);"
        "CREATE TABLE jobs (job TEXT PRIMARY KEY, first_seen_ns INTEGER NOT NULL);"
        "CREATE TABLE tags (job TEXT NOT NULL, tag TEXT NOT NULL, "
        "first_commit_ns INTEGER NOT NULL, PRIMARY KEY (job, tag));"
        "INSERT INTO tags VALUES ('job', 'step1', 5);"
        "CREATE TABLE files (job TEXT NOT NULL, path TEXT NOT NULL, tag TEXT NOT NULL, "
        "rank INTEGER NOT NULL, size INTEGER NOT NULL, state TEXT NOT NULL, version INTEGER NOT NULL, "
        "records TEXT NOT NULL, created_ns INTEGER NOT NULL, committed_ns INTEGER NOT NULL, "
        "persisted_ns INTEGER NOT NULL, reason TEXT NOT NULL, uid INTEGER NOT NULL, "
        "gid INTEGER NOT NULL, PRIMARY KEY (job, path));"
        "INSERT INTO files VALUES ('job', '/c/a.pt', 'step1', 0, 10, 'PERSISTED', 3, '', 1, 2, 3, '', 0, 0);"
        "CREATE TABLE servers (endpoint TEXT PRIMARY KEY, pid INTEGER NOT NULL, "
        "heartbeat_ns INTEGER NOT NULL);";
    ASSERT_EQ(sqlite3_exec(h, v1, nullptr, nullptr, nullptr), SQLITE_OK);
    sqlite3_close(h);
  }
  for (int open = 0; open < 2; ++open) {  // migrating, then reopening: idempotent
    std::unique_ptr<MetaStore> store;
    Status s = OpenMetaStore("sqlite://" + db, &store);
    ASSERT_TRUE(s.ok()) << s.ToString();
    std::vector<FileInfo> files;
    ASSERT_TRUE(store->LoadFiles(&files).ok());
    ASSERT_EQ(files.size(), 1u);
    EXPECT_EQ(files[0].path, "/c/a.pt");
    std::vector<TagInfo> tags;
    ASSERT_TRUE(store->LoadTags(&tags).ok());
    EXPECT_EQ(tags.size(), static_cast<size_t>(open));  // v1's tag row was never complete
    if (open == 0) ASSERT_TRUE(store->Apply({TagChange("step1", 9, {{0, "/c/a.pt", 10}})}).ok());
    store.reset();  // the store holds its database exclusively while open
    EXPECT_EQ(Count(db, "SELECT MAX(version) FROM schema_version"), MetaStore::kSchemaVersion);
    EXPECT_EQ(Count(db, "SELECT COUNT(*) FROM schema_version"), 1);
  }
  EXPECT_EQ(Count(db, "SELECT first_commit_ns FROM tags WHERE tag='step1'"), 5);  // kept
  fs::remove_all(dir);
}

}  // namespace
}  // namespace tce

namespace tce {
namespace {

TEST(SqliteStore, RingsAreKeptPerServer) {
  std::string dir = MakeTempDir("tce-meta");
  const std::string url = "sqlite://" + dir + "/tce.db";
  {
    std::unique_ptr<MetaStore> store;
    ASSERT_TRUE(OpenMetaStore(url, &store).ok());
    std::vector<MetaChange> batch{
        RingInfo{"job", "10.0.0.1:7070", 0, {"10.0.0.1:7070", "10.0.0.2:7070"}},
        RingInfo{"job", "10.0.0.2:7070", 1, {"10.0.0.1:7070", "10.0.0.2:7070"}},
        RingInfo{"job", "10.0.0.1:7070", 2, {"a:1", "b:2", "10.0.0.1:7070"}}};  // told again: replaces
    ASSERT_TRUE(store->Apply(batch).ok());
  }
  std::unique_ptr<MetaStore> store;
  ASSERT_TRUE(OpenMetaStore(url, &store).ok());
  std::vector<RingInfo> rings;
  ASSERT_TRUE(store->LoadRings("10.0.0.1:7070", &rings).ok());
  ASSERT_EQ(rings.size(), 1u);
  EXPECT_EQ(rings[0].job, "job");
  EXPECT_EQ(rings[0].node_rank, 2);
  EXPECT_EQ(rings[0].endpoints, (std::vector<std::string>{"a:1", "b:2", "10.0.0.1:7070"}));
  rings.clear();
  ASSERT_TRUE(store->LoadRings("elsewhere:1", &rings).ok());
  EXPECT_TRUE(rings.empty());
}

}  // namespace
}  // namespace tce

namespace tce {
namespace {

void Exec(const std::string& db, const std::string& sql) {
  sqlite3* h;
  ASSERT_EQ(sqlite3_open(db.c_str(), &h), SQLITE_OK);
  char* err = nullptr;
  EXPECT_EQ(sqlite3_exec(h, sql.c_str(), nullptr, nullptr, &err), SQLITE_OK) << (err ? err : "");
  sqlite3_free(err);
  sqlite3_close(h);
}

// Values hold any bytes: bound with their lengths, read back whole.
TEST(SqliteStore, ValuesWithNulRoundTripWhole) {
  std::string dir = MakeTempDir("tce-meta");
  std::string url = "sqlite://" + dir + "/tce.db";
  FileInfo f = File("/c/a.pt", FileState::kFailed);
  f.reason = std::string("disk said \0 and stopped", 23);
  f.records[0].name = std::string("x/\0data/0", 9);
  {
    std::unique_ptr<MetaStore> store;
    ASSERT_TRUE(OpenMetaStore(url, &store).ok());
    ASSERT_TRUE(store->Apply({f}).ok());
  }
  std::unique_ptr<MetaStore> again;
  ASSERT_TRUE(OpenMetaStore(url, &again).ok());
  std::vector<FileInfo> files;
  ASSERT_TRUE(again->LoadFiles(&files).ok());
  ASSERT_EQ(files.size(), 1u);
  EXPECT_EQ(files[0].reason, f.reason);
  EXPECT_EQ(files[0].records[0].name, f.records[0].name);
  fs::remove_all(dir);
}

// Each kind of damage costs its row only; the store opens and loads the rest.
TEST(SqliteStore, DamagedRowsAreSkipped) {
  std::string dir = MakeTempDir("tce-meta");
  std::string db = dir + "/tce.db";
  {
    std::unique_ptr<MetaStore> store;
    ASSERT_TRUE(OpenMetaStore("sqlite://" + db, &store).ok());
    std::vector<MetaChange> batch;
    for (const char* p : {"/c/good.pt", "/c/records.pt", "/c/rank.pt", "/c/state.pt", "/c/size.pt",
                          "/c/nul.pt"})
      batch.push_back(File(p, FileState::kPersisted));
    batch.push_back(TagChange("good", 1000, {{0, "/c/good.pt", 1}}));
    batch.push_back(TagChange("files", 2000, {{0, "/c/a.pt", 1}}));
    batch.push_back(TagChange("world", 3000, {{0, "/c/b.pt", 1}}));
    batch.push_back(TagChange("nulpath", 4000, {{0, "/c/a.pt", 1}}));
    ASSERT_TRUE(store->Apply(batch).ok());
    RingInfo ring{"job", "me:1", 0, {"me:1", "you:2"}};
    RingInfo bad_ring = ring;
    bad_ring.job = "job2";
    ASSERT_TRUE(store->Apply({ring, bad_ring}).ok());
  }
  Exec(db, "UPDATE files SET records = 'abc:def' WHERE path = '/c/records.pt'");
  Exec(db, "UPDATE files SET rank = 'three' WHERE path = '/c/rank.pt'");
  Exec(db, "UPDATE files SET state = 'SLEEPING' WHERE path = '/c/state.pt'");
  Exec(db, "UPDATE files SET size = 1.5 WHERE path = '/c/size.pt'");
  Exec(db, "UPDATE files SET path = CAST(X'2F632F6E00782E7074' AS TEXT) WHERE path = '/c/nul.pt'");
  Exec(db, "UPDATE tags SET files = '0 1 10:/c/a.pt\n' WHERE tag = 'files'");  // the length lies
  Exec(db, "UPDATE tags SET world_size = 'many' WHERE tag = 'world'");
  Exec(db, "UPDATE tags SET files = CAST(X'30203120393A2F632F6100782E70740A' AS TEXT) WHERE tag = 'nulpath'");
  Exec(db, "UPDATE rings SET node_rank = -4 WHERE job = 'job2'");
  std::unique_ptr<MetaStore> again;
  ASSERT_TRUE(OpenMetaStore("sqlite://" + db, &again).ok());
  std::vector<FileInfo> files;
  ASSERT_TRUE(again->LoadFiles(&files).ok());
  ASSERT_EQ(files.size(), 1u);
  EXPECT_EQ(files[0].path, "/c/good.pt");
  std::vector<TagInfo> tags;
  ASSERT_TRUE(again->LoadTags(&tags).ok());
  ASSERT_EQ(tags.size(), 1u);
  EXPECT_EQ(tags[0].tag, "good");
  std::vector<RingInfo> rings;
  ASSERT_TRUE(again->LoadRings("me:1", &rings).ok());
  ASSERT_EQ(rings.size(), 1u);
  EXPECT_EQ(rings[0].job, "job");
  fs::remove_all(dir);
}

}  // namespace
}  // namespace tce
