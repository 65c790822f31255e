// The SQL rendered from the one schema, pinned: a new database of either
// backend is created exactly as every earlier release created it (SQLite
// keeps this text in sqlite_master), and each migration step is what those
// releases ran. A change here is a schema change: it needs a new version
// and a migration step.
#include "meta/schema.h"

#include <gtest/gtest.h>

namespace tce {
namespace schema {
namespace {

#define CS "CHARACTER SET utf8mb4 COLLATE utf8mb4_bin"

TEST(Schema, SqliteTablesAreTheStoredOnes) {
  const std::vector<std::string> expected = {
      "CREATE TABLE IF NOT EXISTS schema_version (version INTEGER NOT NULL)",
      "CREATE TABLE IF NOT EXISTS jobs (job TEXT PRIMARY KEY, first_seen_ns INTEGER NOT NULL)",
      "CREATE TABLE IF NOT EXISTS tags (job TEXT NOT NULL, tag TEXT NOT NULL, "
      "first_commit_ns INTEGER NOT NULL, complete_ns INTEGER NOT NULL DEFAULT 0, "
      "world_size INTEGER NOT NULL DEFAULT 0, files TEXT NOT NULL DEFAULT '', version INTEGER NOT NULL DEFAULT 0, "
      "epoch INTEGER NOT NULL DEFAULT 0, PRIMARY KEY (job, tag))",
      "CREATE TABLE IF NOT EXISTS files (job TEXT NOT NULL, path TEXT NOT NULL, tag TEXT NOT NULL, "
      "rank INTEGER NOT NULL, size INTEGER NOT NULL, state TEXT NOT NULL, version INTEGER NOT NULL, "
      "records TEXT NOT NULL, created_ns INTEGER NOT NULL, committed_ns INTEGER NOT NULL, "
      "persisted_ns INTEGER NOT NULL, reason TEXT NOT NULL, uid INTEGER NOT NULL, "
      "gid INTEGER NOT NULL, PRIMARY KEY (job, path))",
      "CREATE TABLE IF NOT EXISTS servers (endpoint TEXT PRIMARY KEY, pid INTEGER NOT NULL, "
      "heartbeat_ns INTEGER NOT NULL)",
      "CREATE TABLE IF NOT EXISTS rings (job TEXT NOT NULL, self TEXT NOT NULL, node_rank INTEGER NOT NULL, "
      "endpoints TEXT NOT NULL, PRIMARY KEY (job, self))",
  };
  EXPECT_EQ(CreateTablesSql(kSqlite), expected);
}

TEST(Schema, MysqlTablesAreTheStoredOnes) {
  const std::vector<std::string> expected = {
      "CREATE TABLE IF NOT EXISTS schema_version (version INT NOT NULL)",
      "CREATE TABLE IF NOT EXISTS jobs (job VARCHAR(255) " CS " PRIMARY KEY, first_seen_ns BIGINT NOT NULL)",
      "CREATE TABLE IF NOT EXISTS tags (server VARCHAR(255) " CS " NOT NULL DEFAULT '', job VARCHAR(255) " CS
      " NOT NULL, tag VARCHAR(255) " CS " NOT NULL, first_commit_ns BIGINT NOT NULL, "
      "complete_ns BIGINT NOT NULL DEFAULT 0, world_size INT NOT NULL DEFAULT 0, files MEDIUMTEXT NULL, "
      "version BIGINT UNSIGNED NOT NULL DEFAULT 0, epoch BIGINT NOT NULL DEFAULT 0, PRIMARY KEY (server, job, tag))",
      "CREATE TABLE IF NOT EXISTS files (file_key BINARY(32) PRIMARY KEY, server VARCHAR(255) " CS
      " NOT NULL DEFAULT '', job VARCHAR(255) " CS " NOT NULL, path TEXT NOT NULL, "
      "tag VARCHAR(255) NOT NULL, `rank` INT NOT NULL, size BIGINT UNSIGNED NOT NULL, "
      "state VARCHAR(16) NOT NULL, version BIGINT UNSIGNED NOT NULL, records MEDIUMTEXT NOT NULL, "
      "created_ns BIGINT NOT NULL, committed_ns BIGINT NOT NULL, persisted_ns BIGINT NOT NULL, "
      "reason TEXT NOT NULL, uid BIGINT NOT NULL, gid BIGINT NOT NULL, KEY (job), KEY server_key (server))",
      "CREATE TABLE IF NOT EXISTS servers (endpoint VARCHAR(255) PRIMARY KEY, pid BIGINT NOT NULL, "
      "heartbeat_ns BIGINT NOT NULL)",
      "CREATE TABLE IF NOT EXISTS rings (job VARCHAR(255) " CS " NOT NULL, "
      "self VARCHAR(255) NOT NULL, node_rank INT NOT NULL, endpoints MEDIUMTEXT NOT NULL, "
      "PRIMARY KEY (job, self))",
  };
  EXPECT_EQ(CreateTablesSql(kMysql), expected);
}

TEST(Schema, OneStepPerVersion) {
  ASSERT_EQ(Migrations().size(), static_cast<size_t>(kVersion - 1));
  for (size_t i = 0; i < Migrations().size(); ++i) EXPECT_EQ(Migrations()[i].to, static_cast<int>(i) + 2);
}

TEST(Schema, MigrationStepsAreTheReleasedOnes) {
  using V = std::vector<std::string>;
  EXPECT_EQ(MigrationSql(kSqlite, Migrations()[0]),
            (V{"ALTER TABLE tags ADD COLUMN complete_ns INTEGER NOT NULL DEFAULT 0",
               "ALTER TABLE tags ADD COLUMN world_size INTEGER NOT NULL DEFAULT 0",
               "ALTER TABLE tags ADD COLUMN files TEXT NOT NULL DEFAULT ''"}));
  EXPECT_EQ(MigrationSql(kMysql, Migrations()[0]),
            (V{"ALTER TABLE tags ADD COLUMN complete_ns BIGINT NOT NULL DEFAULT 0",
               "ALTER TABLE tags ADD COLUMN world_size INT NOT NULL DEFAULT 0",
               "ALTER TABLE tags ADD COLUMN files MEDIUMTEXT NULL"}));
  EXPECT_EQ(MigrationSql(kSqlite, Migrations()[1]), V{});  // v3: the rings table, created
  EXPECT_EQ(MigrationSql(kMysql, Migrations()[1]), V{});
  EXPECT_EQ(MigrationSql(kSqlite, Migrations()[2]), V{});  // v4: a SQLite file has one server
  EXPECT_EQ(MigrationSql(kMysql, Migrations()[2]),
            (V{"ALTER TABLE tags ADD COLUMN server VARCHAR(255) " CS " NOT NULL DEFAULT '' FIRST, "
               "DROP PRIMARY KEY, ADD PRIMARY KEY (server, job, tag)",
               "ALTER TABLE files ADD COLUMN server VARCHAR(255) " CS " NOT NULL DEFAULT '' AFTER file_key, "
               "ADD KEY server_key (server)"}));
  EXPECT_EQ(MigrationSql(kSqlite, Migrations()[3]),  // v5: published versions
            V{"ALTER TABLE tags ADD COLUMN version INTEGER NOT NULL DEFAULT 0"});
  EXPECT_EQ(MigrationSql(kMysql, Migrations()[3]),
            V{"ALTER TABLE tags ADD COLUMN version BIGINT UNSIGNED NOT NULL DEFAULT 0"});
  EXPECT_EQ(MigrationSql(kSqlite, Migrations()[4]),  // v6: the epoch of a job's numbering
            V{"ALTER TABLE tags ADD COLUMN epoch INTEGER NOT NULL DEFAULT 0"});
  EXPECT_EQ(MigrationSql(kMysql, Migrations()[4]), V{"ALTER TABLE tags ADD COLUMN epoch BIGINT NOT NULL DEFAULT 0"});
}

TEST(Schema, Statements) {
  EXPECT_EQ(InsertSql(kSqlite, "jobs", {{"job"}, {"first_seen_ns"}}),
            "INSERT OR IGNORE INTO jobs (job, first_seen_ns) VALUES (?, ?)");
  EXPECT_EQ(InsertSql(kMysql, "tags", {{"job"}, {"tag"}, {"first_commit_ns"}}),
            "INSERT IGNORE INTO tags (server, job, tag, first_commit_ns) VALUES (?, ?, ?, ?)");
  EXPECT_EQ(InsertSql(kSqlite, "files", {{"job"}, {"path"}, {"rank"}}, {"rank"}),
            "INSERT INTO files (job, path, rank) VALUES (?, ?, ?) ON CONFLICT (job, path) DO UPDATE SET "
            "rank=excluded.rank");
  EXPECT_EQ(InsertSql(kMysql, "files", {{"job"}, {"path"}, {"rank"}}, {"rank"}),
            "INSERT INTO files (file_key, server, job, path, `rank`) VALUES "
            "(UNHEX(SHA2(CONCAT(?, CHAR(0), ?, CHAR(0), ?), 256)), ?, ?, ?, ?) "
            "ON DUPLICATE KEY UPDATE `rank`=VALUES(`rank`)");
  EXPECT_EQ(InsertSql(kMysql, "servers", {{"endpoint"}, {"pid"}, {"heartbeat_ns", kMysql.now_ns}}, {"pid"}),
            "INSERT INTO servers (endpoint, pid, heartbeat_ns) VALUES (?, ?, "
            "CAST(UNIX_TIMESTAMP(NOW(6)) * 1000000000 AS SIGNED)) ON DUPLICATE KEY UPDATE pid=VALUES(pid)");
  EXPECT_EQ(DeleteByKeySql(kSqlite, "files"), "DELETE FROM files WHERE job = ? AND path = ?");
  EXPECT_EQ(DeleteByKeySql(kMysql, "files"),
            "DELETE FROM files WHERE file_key = UNHEX(SHA2(CONCAT(?, CHAR(0), ?, CHAR(0), ?), 256))");
  const std::vector<const char*> rings = NonKeyColumns("rings");  // compared as text, not pointers
  EXPECT_EQ(std::vector<std::string>(rings.begin(), rings.end()),
            (std::vector<std::string>{"node_rank", "endpoints"}));
}

// A store's connection, scripted: records what ran, reports `version`.
class FakeConnection : public Connection {
 public:
  explicit FakeConnection(int version) : version_(version) {}
  Status Execute(const std::string& sql, bool migrating) override {
    ran.push_back((migrating ? "M " : "") + sql);
    const std::string update = "UPDATE schema_version SET version = ";
    if (sql.compare(0, update.size(), update) == 0) version_ = std::stoi(sql.substr(update.size()));
    return Status::OK();
  }
  Status ReadVersion(int* version) override {
    *version = version_;
    return Status::OK();
  }
  std::vector<std::string> ran;

 private:
  int version_;
};

TEST(Schema, ApplyMigratesStepByStep) {
  FakeConnection db(1);
  ASSERT_TRUE(ApplySchema(kSqlite, &db, "test").ok());
  ASSERT_GE(db.ran.size(), 3u);
  EXPECT_EQ(db.ran.front(), "BEGIN");  // SQLite: all or nothing
  EXPECT_EQ(db.ran.back(), "COMMIT");
  int updates = 0, migrating = 0;
  for (const std::string& sql : db.ran) {
    updates += sql.rfind("UPDATE schema_version", 0) == 0;
    migrating += sql.rfind("M ", 0) == 0;
  }
  EXPECT_EQ(updates, kVersion - 1);
  EXPECT_EQ(migrating, 5);  // v2's three columns, v5's one, v6's one

  FakeConnection mysql(3);
  ASSERT_TRUE(ApplySchema(kMysql, &mysql, "test").ok());
  EXPECT_NE(mysql.ran.front(), "BEGIN");  // MySQL commits DDL: each step stands alone
  EXPECT_EQ(mysql.ran.back(), "UPDATE schema_version SET version = 6 WHERE version = 5");
}

TEST(Schema, ApplyRefusesANewerDatabase) {
  FakeConnection db(kVersion + 1);
  const Status s = ApplySchema(kSqlite, &db, "test");
  EXPECT_EQ(s.code(), Status::Code::kFailedPrecondition);
  EXPECT_EQ(s.message(), "metadata schema version " + std::to_string(kVersion + 1) +
                             " is newer than this server's " + std::to_string(kVersion));
  EXPECT_EQ(db.ran.back(), "ROLLBACK");
}

}  // namespace
}  // namespace schema
}  // namespace tce
