#include "meta/schema.h"

#include <cstdlib>
#include <cstring>

#include "common/logging.h"

namespace tce {
namespace schema {
namespace {

using T = Type;

std::string Join(const std::vector<std::string>& parts, const char* separator) {
  std::string out;
  for (size_t i = 0; i < parts.size(); ++i) out += (i ? separator : "") + parts[i];
  return out;
}

// `format` with every "%s" replaced by `arg`.
std::string Format(const char* format, const std::string& arg) {
  std::string out;
  for (const char* p = format; *p; ++p) {
    if (p[0] == '%' && p[1] == 's') {
      out += arg;
      ++p;
    } else {
      out += *p;
    }
  }
  return out;
}

bool HasServer(const Dialect& d, const Table& t) { return d.shared && t.per_server; }

// The key's columns as this dialect stores them: the server first where
// the rows carry one.
std::vector<const char*> KeyColumns(const Dialect& d, const Table& t) {
  std::vector<const char*> key;
  if (HasServer(d, t)) key.push_back(kServerColumn);
  key.insert(key.end(), t.key.begin(), t.key.end());
  return key;
}

bool HashedKey(const Dialect& d, const Table& t) {
  if (!d.hash_text_keys) return false;
  for (const char* k : t.key)
    for (const Column& c : t.columns)
      if (std::strcmp(c.name, k) == 0 && c.type == T::kText) return true;
  return false;
}

const Column kServer{kServerColumn, T::kName, "''"};
const Column kHashKey{kHashKeyColumn, T::kHash};

std::string ColumnSql(const Dialect& d, const Column& c, bool inline_key) {
  std::string sql = Quote(d, c.name) + " " + d.types[static_cast<int>(c.type)];
  if (inline_key) return sql + " PRIMARY KEY";
  if (!c.default_value) return sql + " NOT NULL";
  if (c.type == T::kLongText && !d.long_text_default) return sql + " NULL";
  return sql + " NOT NULL DEFAULT " + c.default_value;
}

const Column& GetColumn(const Table& t, const char* name) {
  for (const Column& c : t.columns)
    if (std::strcmp(c.name, name) == 0) return c;
  TCE_LOG(kError, "meta") << "schema: table " << t.name << " has no column " << name;
  std::abort();
}

std::string QuotedList(const Dialect& d, const std::vector<const char*>& names) {
  std::vector<std::string> quoted;
  for (const char* n : names) quoted.push_back(Quote(d, n));
  return Join(quoted, ", ");
}

// The dialect's indexes of a table whose key it hashes (those whose columns
// the table has there).
std::vector<std::string> IndexesSql(const Dialect& d, const Table& t, const char* prefix,
                                    bool only_server) {
  std::vector<std::string> out;
  for (const Index& index : t.hashed_key_indexes) {
    bool has_server = false, present = true;
    for (const char* c : index.columns) {
      const bool server = std::strcmp(c, kServerColumn) == 0;
      has_server |= server;
      if (server && !HasServer(d, t)) present = false;
    }
    if (!present || (only_server && !has_server)) continue;
    out.push_back(std::string(prefix) + "KEY " + (index.name ? std::string(index.name) + " " : "") + "(" +
                  QuotedList(d, index.columns) + ")");
  }
  return out;
}

std::string HashSql(const Dialect& d, const Table& t) {
  std::vector<std::string> params(KeyColumns(d, t).size(), "?");
  return Format(d.hash_format, Join(params, d.hash_separator));
}

}  // namespace

const Dialect kSqlite = {
    "sqlite",
    {"INTEGER", "INTEGER", "INTEGER", "TEXT", "TEXT", "TEXT", "TEXT", "TEXT", "BLOB"},
    {},
    '"',
    /*shared=*/false,
    /*hash_text_keys=*/false,
    nullptr,
    nullptr,
    /*long_text_default=*/true,
    /*transactional_ddl=*/true,
    "INSERT OR IGNORE",
    "ON CONFLICT (%s) DO UPDATE SET ",
    "%s=excluded.%s",
    "",
    "CAST((julianday('now') - 2440587.5) * 86400000000000 AS INTEGER)",
};

const Dialect kMysql = {
    "mysql",
    {"INT", "BIGINT", "BIGINT UNSIGNED", "VARCHAR(255) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin",
     "VARCHAR(255)", "VARCHAR(16)", "TEXT", "MEDIUMTEXT", "BINARY(32)"},
    {"rank"},
    '`',
    /*shared=*/true,
    /*hash_text_keys=*/true,
    "UNHEX(SHA2(CONCAT(%s), 256))",
    ", CHAR(0), ",
    /*long_text_default=*/false,
    /*transactional_ddl=*/false,
    "INSERT IGNORE",
    "ON DUPLICATE KEY UPDATE ",
    "%s=VALUES(%s)",
    " FROM DUAL",
    "CAST(UNIX_TIMESTAMP(NOW(6)) * 1000000000 AS SIGNED)",
};

const std::vector<Table>& Tables() {
  static const std::vector<Table> tables = {
      {"schema_version", {{"version", T::kInt}}, {}},
      {"jobs", {{"job", T::kName}, {"first_seen_ns", T::kBigInt}}, {"job"}},
      {"tags",
       {{"job", T::kName},
        {"tag", T::kName},
        {"first_commit_ns", T::kBigInt},
        {"complete_ns", T::kBigInt, "0"},
        {"world_size", T::kInt, "0"},
        {"files", T::kLongText, "''"},
        {"version", T::kUnsigned, "0"},
        {"epoch", T::kBigInt, "0"}},
       {"job", "tag"},
       /*per_server=*/true},
      {"files",
       {{"job", T::kName},
        {"path", T::kText},
        {"tag", T::kShortText},
        {"rank", T::kInt},
        {"size", T::kUnsigned},
        {"state", T::kState},
        {"version", T::kUnsigned},
        {"records", T::kLongText},
        {"created_ns", T::kBigInt},
        {"committed_ns", T::kBigInt},
        {"persisted_ns", T::kBigInt},
        {"reason", T::kText},
        {"uid", T::kBigInt},
        {"gid", T::kBigInt}},
       {"job", "path"},
       /*per_server=*/true,
       {{nullptr, {"job"}}, {"server_key", {kServerColumn}}}},
      {"servers", {{"endpoint", T::kShortText}, {"pid", T::kBigInt}, {"heartbeat_ns", T::kBigInt}}, {"endpoint"}},
      {"rings",
       {{"job", T::kName}, {"self", T::kShortText}, {"node_rank", T::kInt}, {"endpoints", T::kLongText}},
       {"job", "self"}},
  };
  return tables;
}

const Table& GetTable(const char* name) {
  for (const Table& t : Tables())
    if (std::strcmp(t.name, name) == 0) return t;
  TCE_LOG(kError, "meta") << "schema: no table " << name;
  std::abort();
}

const std::vector<Migration>& Migrations() {
  static const std::vector<Migration> steps = {
      {2, Migration::Kind::kAddColumns, "tags", {"complete_ns", "world_size", "files"}, nullptr},
      {3, Migration::Kind::kAddTable, "rings", {}, nullptr},
      {4, Migration::Kind::kAddServer, nullptr, {},
       "rows written before belong to no server and are not re-indexed"},
      {5, Migration::Kind::kAddColumns, "tags", {"version"}, nullptr},
      {6, Migration::Kind::kAddColumns, "tags", {"epoch"}, nullptr},
  };
  return steps;
}

std::string Quote(const Dialect& d, const char* name) {
  for (const char* r : d.reserved)
    if (std::strcmp(r, name) == 0) return d.quote + std::string(name) + d.quote;
  return name;
}

std::vector<std::string> CreateTablesSql(const Dialect& d) {
  std::vector<std::string> out;
  for (const Table& t : Tables()) {
    const bool hashed = HashedKey(d, t);
    const std::vector<const char*> key = KeyColumns(d, t);
    const bool inline_key = !hashed && key.size() == 1;
    std::vector<std::string> parts;
    if (hashed) parts.push_back(ColumnSql(d, kHashKey, true));
    if (HasServer(d, t)) parts.push_back(ColumnSql(d, kServer, false));
    for (const Column& c : t.columns)
      parts.push_back(ColumnSql(d, c, inline_key && std::strcmp(c.name, key[0]) == 0));
    if (!hashed && key.size() > 1) parts.push_back("PRIMARY KEY (" + QuotedList(d, key) + ")");
    if (hashed)
      for (std::string& index : IndexesSql(d, t, "", false)) parts.push_back(std::move(index));
    out.push_back("CREATE TABLE IF NOT EXISTS " + std::string(t.name) + " (" + Join(parts, ", ") + ")");
  }
  return out;
}

std::vector<const char*> NonKeyColumns(const char* table) {
  const Table& t = GetTable(table);
  std::vector<const char*> out;
  for (const Column& c : t.columns) {
    bool in_key = false;
    for (const char* k : t.key) in_key |= std::strcmp(k, c.name) == 0;
    if (!in_key) out.push_back(c.name);
  }
  return out;
}

std::string InsertSql(const Dialect& d, const char* table, const std::vector<Value>& values,
                      const std::vector<const char*>& update) {
  const Table& t = GetTable(table);
  std::vector<std::string> columns, params;
  const bool hashed = HashedKey(d, t);
  if (hashed) {
    columns.push_back(kHashKeyColumn);
    params.push_back(HashSql(d, t));
  }
  if (HasServer(d, t)) {
    columns.push_back(kServerColumn);
    params.push_back("?");
  }
  for (const Value& v : values) {
    columns.push_back(Quote(d, GetColumn(t, v.column).name));
    params.push_back(v.value);
  }
  std::string sql = std::string(update.empty() ? d.insert_ignore : "INSERT") + " INTO " + t.name + " (" +
                    Join(columns, ", ") + ") VALUES (" + Join(params, ", ") + ")";
  if (update.empty()) return sql;
  std::vector<std::string> sets;
  for (const char* c : update) sets.push_back(Format(d.update_format, Quote(d, GetColumn(t, c).name)));
  const std::string key = hashed ? kHashKeyColumn : QuotedList(d, KeyColumns(d, t));
  return sql + " " + Format(d.conflict_format, key) + Join(sets, ", ");
}

std::string DeleteByKeySql(const Dialect& d, const char* table) {
  const Table& t = GetTable(table);
  const std::string sql = "DELETE FROM " + std::string(t.name) + " WHERE ";
  if (HashedKey(d, t)) return sql + kHashKeyColumn + " = " + HashSql(d, t);
  std::vector<std::string> terms;
  for (const char* k : KeyColumns(d, t)) terms.push_back(Quote(d, k) + " = ?");
  return sql + Join(terms, " AND ");
}

std::vector<std::string> MigrationSql(const Dialect& d, const Migration& m) {
  std::vector<std::string> out;
  switch (m.kind) {
    case Migration::Kind::kAddColumns: {
      const Table& t = GetTable(m.table);
      for (const char* c : m.columns)
        out.push_back("ALTER TABLE " + std::string(t.name) + " ADD COLUMN " + ColumnSql(d, GetColumn(t, c), false));
      break;
    }
    case Migration::Kind::kAddTable:
      break;  // CreateTablesSql made it
    case Migration::Kind::kAddServer:
      if (!d.shared) break;
      for (const Table& t : Tables()) {
        if (!t.per_server) continue;
        const bool hashed = HashedKey(d, t);
        std::string sql = "ALTER TABLE " + std::string(t.name) + " ADD COLUMN " + ColumnSql(d, kServer, false) +
                          (hashed ? std::string(" AFTER ") + kHashKeyColumn : std::string(" FIRST"));
        if (hashed)
          for (const std::string& index : IndexesSql(d, t, "ADD ", true)) sql += ", " + index;
        else
          sql += ", DROP PRIMARY KEY, ADD PRIMARY KEY (" + QuotedList(d, KeyColumns(d, t)) + ")";
        out.push_back(std::move(sql));
      }
      break;
  }
  return out;
}

namespace {

Status CreateAndMigrate(const Dialect& d, Connection* db, const std::string& where) {
  for (const std::string& sql : CreateTablesSql(d)) {
    Status s = db->Execute(sql, false);
    if (!s.ok()) return s;
  }
  Status s = db->Execute("INSERT INTO schema_version SELECT " + std::to_string(kVersion) + d.select_constant_suffix +
                             " WHERE NOT EXISTS (SELECT 1 FROM schema_version)",
                         false);
  int version = 0;
  if (s.ok()) s = db->ReadVersion(&version);
  while (s.ok() && version >= 1 && version < kVersion) {
    const Migration& step = Migrations()[version - 1];  // the step to version + 1
    const std::vector<std::string> statements = MigrationSql(d, step);
    for (const std::string& sql : statements)
      if (s.ok()) s = db->Execute(sql, true);
    // Where another server migrated first, this changes nothing.
    if (s.ok())
      s = db->Execute("UPDATE schema_version SET version = " + std::to_string(step.to) +
                          " WHERE version = " + std::to_string(version),
                      false);
    if (!s.ok()) return s;
    TCE_LOG(kInfo, "meta") << "migrated " << where << " from schema " << version << " to " << step.to
                           << (step.note && !statements.empty() ? std::string(" (") + step.note + ")" : "");
    const int before = version;
    if (!(s = db->ReadVersion(&version)).ok()) return s;
    if (version <= before)
      return Status::Internal("metadata schema version stays " + std::to_string(version) + " after migrating");
  }
  if (s.ok() && version > kVersion)
    return Status::FailedPrecondition("metadata schema version " + std::to_string(version) +
                                      " is newer than this server's " + std::to_string(kVersion));
  return s;
}

}  // namespace

Status ApplySchema(const Dialect& d, Connection* db, const std::string& where) {
  if (!d.transactional_ddl) return CreateAndMigrate(d, db, where);
  Status s = db->Execute("BEGIN", false);
  if (s.ok()) s = CreateAndMigrate(d, db, where);
  if (s.ok()) s = db->Execute("COMMIT", false);
  if (!s.ok()) {
    Status ignored = db->Execute("ROLLBACK", false);
    (void)ignored;
  }
  return s;
}

}  // namespace schema
}  // namespace tce
