// The metadata schema, defined once for every backend: its tables (columns,
// keys, indexes), the steps that bring a database of any earlier version to
// this one, and a Dialect per backend naming everything that differs between
// them (types, collation, quoting, upsert syntax, shared rows, hashed keys,
// transactional DDL). Each store runs the SQL rendered here and binds its
// parameters in the order documented below. Pure data and string functions,
// except ApplySchema, which runs on the store's one thread.
#pragma once

#include <string>
#include <vector>

#include "common/status.h"

namespace tce {
namespace schema {

// v2 added the tags table's complete_ns, world_size and files columns, v3
// the rings table, v4 (shared dialects) the server column of files and tags,
// v5 the tags table's version column (published versions), v6 its epoch
// column (the numbering a version belongs to).
constexpr int kVersion = 6;

// What a column holds; each Dialect names the SQL type.
enum class Type {
  kInt,        // 32-bit signed integer
  kBigInt,     // 64-bit signed integer
  kUnsigned,   // 64-bit unsigned integer
  kName,       // a job, tag or server name: a key, compared byte for byte
  kShortText,  // up to 255 characters, the database's own collation
  kState,      // a file state's stored name (cache/file_state.h)
  kText,       // up to 64 KiB (paths, reasons)
  kLongText,   // a row_codec.h list (records, a tag's files, endpoints)
  kHash,       // a 32-byte SHA-256 of a key too long to index
};
constexpr int kTypeCount = 9;

struct Column {
  const char* name;
  Type type;
  const char* default_value = nullptr;  // an SQL literal; none: a value is required
};

struct Index {
  const char* name;  // nullptr: the database names it
  std::vector<const char*> columns;
};

struct Table {
  const char* name;
  std::vector<Column> columns;
  std::vector<const char*> key;  // the primary key
  // Rows carry the server that wrote them where a dialect is shared.
  bool per_server = false;
  // Where the dialect hashes this table's key: indexes that serve the
  // lookups the (hashed) key no longer can.
  std::vector<Index> hashed_key_indexes = {};
};

// The column naming a row's server, and the column holding a hashed key.
constexpr const char* kServerColumn = "server";
constexpr const char* kHashKeyColumn = "file_key";

// Every table, in creation order.
const std::vector<Table>& Tables();
// The table called `name` (one of Tables(); anything else aborts).
const Table& GetTable(const char* name);

// What differs between the SQL of two backends.
struct Dialect {
  const char* name;
  const char* types[kTypeCount];  // indexed by Type
  // Column names this dialect reserves, written quoted (by `quote`).
  std::vector<const char*> reserved;
  char quote;
  // Several servers share one database: per-server tables carry the
  // server column (first in the row and the key).
  bool shared;
  // Keys are short (InnoDB: 3072 bytes): a key holding a kText column (a
  // path may be 4096 bytes) becomes one kHashKeyColumn of its SHA-256.
  bool hash_text_keys;
  // How one key parameter list becomes the hash: `%s` is each "?" joined
  // by `hash_separator`.
  const char* hash_format;
  const char* hash_separator;
  // Whether a kLongText column may have a DEFAULT (MySQL: no; it is NULL
  // instead, which reads back as "").
  bool long_text_default;
  // Schema changes join the open transaction (SQLite). Without that (MySQL
  // commits each ALTER), every migration statement is idempotent: a column
  // another server added first is no error.
  bool transactional_ddl;
  const char* insert_ignore;  // "INSERT OR IGNORE" / "INSERT IGNORE"
  // Upsert: `conflict_format` with %s the key's columns, then each updated
  // column as `update_format` with %s its (quoted) name, joined by ", ".
  const char* conflict_format;
  const char* update_format;
  const char* select_constant_suffix;  // what SELECT <constant> needs: "" / " FROM DUAL"
  const char* now_ns;  // an expression: nanoseconds since the epoch, now
};

extern const Dialect kSqlite;
extern const Dialect kMysql;

// `name` as this dialect writes it (quoted when reserved).
std::string Quote(const Dialect& d, const char* name);

// CREATE TABLE IF NOT EXISTS for every table, in creation order.
std::vector<std::string> CreateTablesSql(const Dialect& d);

// The columns of `table` outside its key, in their order (what an upsert
// of a whole row updates).
std::vector<const char*> NonKeyColumns(const char* table);

// One value written by InsertSql: `value` is "?" (a parameter) or an
// expression of the dialect (kSqlite.now_ns...).
struct Value {
  const char* column;
  std::string value = "?";
};

// INSERT of `values` into `table`; where the dialect adds them, the hashed
// key comes first (its parameters: the key's columns, the server first) and
// the server next (one parameter). A row with the same key is kept when
// `update` is empty, or else gets the new values of the `update` columns.
std::string InsertSql(const Dialect& d, const char* table, const std::vector<Value>& values,
                      const std::vector<const char*>& update = {});
// DELETE of the row whose key columns (the server first where the dialect
// adds it) are the parameters.
std::string DeleteByKeySql(const Dialect& d, const char* table);

// One step of the schema's history: what turns version `to - 1` into `to`.
struct Migration {
  int to;
  enum class Kind {
    kAddColumns,  // `columns` of `table`, as Tables() defines them
    kAddTable,    // `table`, which CreateTablesSql creates
    kAddServer,   // the server column of every per-server table (shared dialects)
  } kind;
  const char* table;
  std::vector<const char*> columns;
  const char* note;  // logged where the step changed something; may be nullptr
};
const std::vector<Migration>& Migrations();
// The statements of one step in `d` (none: the step only moves the version).
std::vector<std::string> MigrationSql(const Dialect& d, const Migration& m);

// What a store lends ApplySchema: its connection, on its one thread.
class Connection {
 public:
  virtual ~Connection() = default;
  // Runs one statement. `migrating`: a step of Migrations(), where a
  // dialect without transactional DDL treats a column that already exists
  // (another server migrated first) as done.
  virtual Status Execute(const std::string& sql, bool migrating) = 0;
  // The largest version recorded (0: none).
  virtual Status ReadVersion(int* version) = 0;
};

// Creates what is missing, records kVersion in a new database and migrates
// an older one step by step (logged, naming `where`); in one transaction
// where the dialect's DDL is transactional. FAILED_PRECONDITION for a
// database newer than this server.
Status ApplySchema(const Dialect& d, Connection* db, const std::string& where);

}  // namespace schema
}  // namespace tce
