// MetaStore on MySQL/MariaDB (Connector/C): mysql://user:password@host:port/db
#include <mysql.h>

#include <cstdlib>
#include <cstring>
#include <vector>

#include "common/logging.h"
#include "common/validate.h"
#include "meta/meta_store.h"
#include "meta/mysql_store.h"
#include "meta/row_codec.h"
#include "meta/schema.h"

namespace tce {
namespace {

const schema::Dialect& kDialect = schema::kMysql;
constexpr unsigned kDuplicateColumn = 1060;  // ER_DUP_FIELDNAME

// A parameter list for one prepared statement.
class Params {
 public:
  Params& Text(const std::string& s) {
    texts_.push_back(s);
    kinds_.push_back(0);
    return *this;
  }
  Params& Int(int64_t v) {
    ints_.push_back(v);
    kinds_.push_back(1);
    return *this;
  }
  std::vector<MYSQL_BIND> Bind() {
    std::vector<MYSQL_BIND> b(kinds_.size());
    lengths_.assign(kinds_.size(), 0);
    size_t t = 0, n = 0;
    for (size_t i = 0; i < kinds_.size(); ++i) {
      std::memset(&b[i], 0, sizeof(MYSQL_BIND));
      if (kinds_[i] == 0) {
        b[i].buffer_type = MYSQL_TYPE_STRING;
        b[i].buffer = const_cast<char*>(texts_[t].data());
        lengths_[i] = texts_[t].size();
        b[i].buffer_length = lengths_[i];
        b[i].length = &lengths_[i];
        ++t;
      } else {
        b[i].buffer_type = MYSQL_TYPE_LONGLONG;
        b[i].buffer = &ints_[n++];
      }
    }
    return b;
  }

 private:
  std::vector<int> kinds_;
  std::vector<std::string> texts_;
  std::vector<int64_t> ints_;
  std::vector<unsigned long> lengths_;
};

class MysqlStore final : public MetaStore, private schema::Connection {
 public:
  explicit MysqlStore(std::string server) : server_(std::move(server)) {}
  ~MysqlStore() override {
    if (db_) mysql_close(db_);
  }

  Status Connect(const MysqlUrl& url) {
    url_ = url;
    db_ = mysql_init(nullptr);
    unsigned int timeout = 5;
    mysql_options(db_, MYSQL_OPT_CONNECT_TIMEOUT, &timeout);
    mysql_options(db_, MYSQL_OPT_READ_TIMEOUT, &timeout);
    mysql_options(db_, MYSQL_OPT_WRITE_TIMEOUT, &timeout);
    if (!mysql_real_connect(db_, url.host.c_str(), url.user.c_str(), url.password.c_str(),
                            url.database.c_str(), url.port, nullptr, 0))
      return Fail("connect to " + url.host + ":" + std::to_string(url.port));
    mysql_set_character_set(db_, "utf8mb4");
    return schema::ApplySchema(kDialect, this, url.database);
  }

  Status Apply(const std::vector<MetaChange>& batch) override {
    Status s = Reconnect();
    if (!s.ok()) return s;
    if (mysql_query(db_, "START TRANSACTION") != 0) return Fail("begin");
    for (const MetaChange& c : batch) {
      if (const RingInfo* ring = std::get_if<RingInfo>(&c)) {
        const RingInfo& r = *ring;
        s = Run(sql_.ring,
                Params().Text(r.job).Text(r.self).Int(r.node_rank).Text(EncodeEndpoints(r.endpoints)));
      } else if (const TagInfo* tag = std::get_if<TagInfo>(&c)) {
        const TagInfo& t = *tag;
        s = Run(sql_.job, Params().Text(t.job).Int(t.complete_unix_ns));
        if (s.ok())
          s = Run(sql_.done,
                  Params().Text(server_).Text(t.job).Text(t.tag).Int(t.complete_unix_ns)
                      .Int(t.complete_unix_ns).Int(t.world_size).Text(EncodeTagFiles(t.files))
                      .Int(static_cast<int64_t>(t.version)).Int(static_cast<int64_t>(t.epoch)));
      } else if (const FileRemoved* gone = std::get_if<FileRemoved>(&c)) {
        s = Run(sql_.remove, Params().Text(server_).Text(gone->job).Text(gone->path));
      } else {
        const FileInfo& f = std::get<FileInfo>(c);
        s = Run(sql_.job, Params().Text(f.job).Int(f.committed_unix_ns));
        if (s.ok() && !f.tag.empty())
          s = Run(sql_.tag,
                  Params().Text(server_).Text(f.job).Text(f.tag).Int(f.committed_unix_ns));
        if (s.ok())
          s = Run(sql_.upsert,
                  Params().Text(server_).Text(f.job).Text(f.path).Text(server_).Text(f.job).Text(f.path)
                      .Text(f.tag).Int(f.rank)
                      .Int(static_cast<int64_t>(f.size)).Text(FileStateName(f.state))
                      .Int(static_cast<int64_t>(f.version)).Text(EncodeRecords(f.records))
                      .Int(f.created_unix_ns).Int(f.committed_unix_ns).Int(f.persisted_unix_ns)
                      .Text(f.reason).Int(f.owner_uid).Int(static_cast<int64_t>(f.owner_gid)));
      }
      if (!s.ok()) break;
    }
    if (s.ok() && mysql_query(db_, "COMMIT") == 0) return Status::OK();
    if (s.ok()) s = Fail("commit");
    mysql_query(db_, "ROLLBACK");
    return s;
  }

  Status LoadFiles(std::vector<FileInfo>* out) override {
    Status s = Reconnect();
    if (!s.ok()) return s;
    const std::string files_sql = "SELECT job, path, tag, `rank`, size, state, version, records, created_ns, "
                                  "committed_ns, persisted_ns, reason, uid, gid FROM files WHERE server = '" +
                                  Quote(server_) + "' ORDER BY job, path";
    if (mysql_query(db_, files_sql.c_str()) != 0) return Fail("select files");
    MYSQL_RES* res = mysql_store_result(db_);
    if (!res) return Fail("select files");
    while (MYSQL_ROW row = mysql_fetch_row(res)) {
      unsigned long* len = mysql_fetch_lengths(res);
      auto text = [&](int i) { return std::string(row[i] ? row[i] : "", row[i] ? len[i] : 0); };
      FileInfo f;
      f.job = text(0);
      f.path = text(1);
      f.tag = text(2);
      int64_t n[8];
      uint64_t size = 0, version = 0;
      const int int_columns[8] = {3, 8, 9, 10, 12, 13, -1, -1};
      Status s = CheckFileKeys(f);
      for (int i = 0; s.ok() && int_columns[i] >= 0; ++i)
        if (!ParseInt64(text(int_columns[i]), &n[i])) s = Status::DataLoss("column " + std::to_string(int_columns[i]) + ": not an integer");
      if (s.ok() && (!ParseUint64(text(4), &size) || !ParseUint64(text(6), &version)))
        s = Status::DataLoss("size/version: not an integer");
      if (s.ok() && !ParseFileState(text(5), &f.state)) s = Status::DataLoss("state: unknown '" + Printable(text(5), 32) + "'");
      if (s.ok()) s = DecodeRecords(text(7), &f.records);
      if (s.ok() && (n[0] < 0 || n[0] >= kMaxWorldSize)) s = Status::DataLoss("rank: out of range");
      if (!s.ok()) {
        Skip("files", "job=" + Printable(f.job) + " path=" + Printable(f.path), s);
        continue;
      }
      f.rank = static_cast<int32_t>(n[0]);
      f.size = size;
      f.version = version;
      f.created_unix_ns = n[1];
      f.committed_unix_ns = n[2];
      f.persisted_unix_ns = n[3];
      f.reason = text(11);
      f.owner_uid = static_cast<uid_t>(n[4]);
      f.owner_gid = static_cast<gid_t>(n[5]);
      out->push_back(std::move(f));
    }
    mysql_free_result(res);
    return Status::OK();
  }

  Status LoadRings(const std::string& self, std::vector<RingInfo>* out) override {
    Status s = Reconnect();
    if (!s.ok()) return s;
    const std::string sql = "SELECT job, node_rank, endpoints FROM rings WHERE self = '" + Quote(self) + "' ORDER BY job";
    if (mysql_query(db_, sql.c_str()) != 0) return Fail("select rings");
    MYSQL_RES* res = mysql_store_result(db_);
    if (!res) return Fail("select rings");
    while (MYSQL_ROW row = mysql_fetch_row(res)) {
      unsigned long* len = mysql_fetch_lengths(res);
      auto text = [&](int i) { return std::string(row[i] ? row[i] : "", row[i] ? len[i] : 0); };
      RingInfo r;
      r.job = text(0);
      r.self = self;
      int64_t rank = 0;
      Status bad = ValidateName("job", r.job, false, true);
      if (bad.ok() && (!ParseInt64(text(1), &rank) || rank < 0 || rank >= kMaxWorldSize))
        bad = Status::DataLoss("node_rank: not a rank");
      if (bad.ok()) bad = DecodeEndpoints(text(2), &r.endpoints);
      if (!bad.ok()) {
        Skip("rings", "job=" + Printable(r.job) + " self=" + Printable(self), bad);
        continue;
      }
      r.node_rank = static_cast<int32_t>(rank);
      out->push_back(std::move(r));
    }
    mysql_free_result(res);
    return Status::OK();
  }

  Status LoadTags(std::vector<TagInfo>* out) override {
    Status s = Reconnect();
    if (!s.ok()) return s;
    const std::string tags_sql = "SELECT job, tag, complete_ns, world_size, files, version, epoch FROM tags "
                                 "WHERE server = '" + Quote(server_) + "' AND complete_ns != 0 "
                                 "ORDER BY job, complete_ns, tag";
    if (mysql_query(db_, tags_sql.c_str()) != 0) return Fail("select tags");
    MYSQL_RES* res = mysql_store_result(db_);
    if (!res) return Fail("select tags");
    while (MYSQL_ROW row = mysql_fetch_row(res)) {
      unsigned long* len = mysql_fetch_lengths(res);
      auto text = [&](int i) { return std::string(row[i] ? row[i] : "", row[i] ? len[i] : 0); };
      TagInfo t;
      t.job = text(0);
      t.tag = text(1);
      int64_t world = 0;
      Status bad;
      if (!ParseInt64(text(2), &t.complete_unix_ns)) bad = Status::DataLoss("complete_ns: not an integer");
      if (bad.ok() && (!ParseInt64(text(3), &world) || world < 1 || world > kMaxWorldSize))
        bad = Status::DataLoss("world_size: not a world size");
      if (bad.ok()) bad = DecodeTagFiles(text(4), &t.files);
      int64_t version = 0;
      if (bad.ok() && (!ParseInt64(text(5), &version) || version < 0))
        bad = Status::DataLoss("version: not a version");
      t.version = static_cast<uint64_t>(version);
      int64_t epoch = 0;
      if (bad.ok() && (!ParseInt64(text(6), &epoch) || epoch < 0)) bad = Status::DataLoss("epoch: not an epoch");
      t.epoch = static_cast<uint64_t>(epoch);
      if (bad.ok()) bad = CheckTag(t);
      if (!bad.ok()) {
        Skip("tags", "job=" + Printable(t.job) + " tag=" + Printable(t.tag), bad);
        continue;
      }
      t.world_size = static_cast<int32_t>(world);
      out->push_back(std::move(t));
    }
    mysql_free_result(res);
    return s;
  }

  Status Heartbeat(const std::string& endpoint, int64_t pid) override {
    Status s = Reconnect();
    if (!s.ok()) return s;
    return Run(sql_.heartbeat, Params().Text(endpoint).Int(pid));
  }

 private:
  // schema::Connection. MySQL commits each ALTER: a column another server
  // added first is no error.
  Status Execute(const std::string& sql, bool migrating) override {
    if (mysql_real_query(db_, sql.data(), sql.size()) == 0) return Status::OK();
    if (migrating && mysql_errno(db_) == kDuplicateColumn) return Status::OK();
    return Fail(migrating ? "migrate" : "schema");
  }
  Status ReadVersion(int* version) override {
    if (mysql_query(db_, "SELECT MAX(version) FROM schema_version") != 0) return Fail("schema version");
    MYSQL_RES* res = mysql_store_result(db_);
    MYSQL_ROW row = res ? mysql_fetch_row(res) : nullptr;
    *version = row && row[0] ? std::atoi(row[0]) : 0;
    if (res) mysql_free_result(res);
    return Status::OK();
  }
  // A row that fails its checks is logged (table and key) and skipped.
  static void Skip(const char* table, const std::string& key, const Status& why) {
    TCE_LOG(kError, "meta") << "skipping a damaged row of table " << table << " (" << key
                            << "): " << why.message();
  }
  // `text` escaped for a quoted SQL string on this connection.
  std::string Quote(const std::string& text) {
    std::string quoted(text.size() * 2 + 1, '\0');
    quoted.resize(mysql_real_escape_string(db_, &quoted[0], text.data(), text.size()));
    return quoted;
  }
  Status Fail(const std::string& what) {
    return Status::Unavailable("mysql " + what + ": " + (db_ ? mysql_error(db_) : "no connection"));
  }
  // After an outage the connection is dead: make a new one.
  Status Reconnect() {
    if (db_ && mysql_ping(db_) == 0) return Status::OK();
    if (db_) mysql_close(db_);
    db_ = nullptr;
    return Connect(url_);
  }
  Status Run(const std::string& sql, Params& params) {  // params: a chained temporary
    MYSQL_STMT* st = mysql_stmt_init(db_);
    if (!st) return Fail("statement");
    std::vector<MYSQL_BIND> b = params.Bind();
    Status s;
    if (mysql_stmt_prepare(st, sql.data(), sql.size()) != 0 || mysql_stmt_bind_param(st, b.data()) != 0 ||
        mysql_stmt_execute(st) != 0)
      s = Status::Unavailable(std::string("mysql: ") + mysql_stmt_error(st));
    mysql_stmt_close(st);
    return s;
  }

  MysqlUrl url_;
  std::string server_;  // whose rows: set before Connect
  // The statements Apply and Heartbeat run, in the order their parameters bind.
  struct Statements {
    std::string upsert = schema::InsertSql(
        kDialect, "files",
        {{"job"}, {"path"}, {"tag"}, {"rank"}, {"size"}, {"state"}, {"version"}, {"records"}, {"created_ns"},
         {"committed_ns"}, {"persisted_ns"}, {"reason"}, {"uid"}, {"gid"}},
        schema::NonKeyColumns("files"));
    std::string remove = schema::DeleteByKeySql(kDialect, "files");
    std::string job = schema::InsertSql(kDialect, "jobs", {{"job"}, {"first_seen_ns"}});
    std::string tag = schema::InsertSql(kDialect, "tags", {{"job"}, {"tag"}, {"first_commit_ns"}});
    std::string done = schema::InsertSql(
        kDialect, "tags", {{"job"}, {"tag"}, {"first_commit_ns"}, {"complete_ns"}, {"world_size"}, {"files"},
                  {"version"}, {"epoch"}},
        {"complete_ns", "world_size", "files", "version", "epoch"});
    std::string ring = schema::InsertSql(kDialect, "rings", {{"job"}, {"self"}, {"node_rank"}, {"endpoints"}},
                                         {"node_rank", "endpoints"});
    std::string heartbeat = schema::InsertSql(
        kDialect, "servers", {{"endpoint"}, {"pid"}, {"heartbeat_ns", kDialect.now_ns}}, {"pid", "heartbeat_ns"});
  } sql_;
  MYSQL* db_ = nullptr;
};

}  // namespace

Status ParseMysqlUrl(const std::string& url, MysqlUrl* out) {
  const std::string scheme = "mysql://";
  if (url.compare(0, scheme.size(), scheme) != 0) return Status::InvalidArgument("not a mysql:// URL");
  std::string rest = url.substr(scheme.size());
  size_t at = rest.rfind('@');
  if (at != std::string::npos) {
    std::string cred = rest.substr(0, at);
    size_t colon = cred.find(':');
    out->user = cred.substr(0, colon);
    if (colon != std::string::npos) out->password = cred.substr(colon + 1);
    rest = rest.substr(at + 1);
  }
  size_t slash = rest.find('/');
  if (slash == std::string::npos || slash + 1 >= rest.size())
    return Status::InvalidArgument("mysql URL needs a database: mysql://user:pass@host:port/db");
  out->database = rest.substr(slash + 1);
  std::string hostport = rest.substr(0, slash);
  size_t colon = hostport.rfind(':');
  out->host = hostport.substr(0, colon);
  out->port = 3306;
  if (colon != std::string::npos) {
    char* end = nullptr;
    long p = std::strtol(hostport.c_str() + colon + 1, &end, 10);
    if (*end || p <= 0 || p > 65535) return Status::InvalidArgument("bad port in " + url);
    out->port = static_cast<unsigned>(p);
  }
  if (out->host.empty()) return Status::InvalidArgument("mysql URL needs a host: " + url);
  return Status::OK();
}

Status OpenMysqlStore(const std::string& url, const std::string& server_id,
                      std::unique_ptr<MetaStore>* out) {
  MysqlUrl u;
  Status s = ParseMysqlUrl(url, &u);
  if (!s.ok()) return s;
  if (server_id.empty()) return Status::InvalidArgument("a shared MySQL store needs a server id");
  auto store = std::make_unique<MysqlStore>(server_id);
  s = store->Connect(u);
  if (!s.ok()) return s;
  *out = std::move(store);
  return Status::OK();
}

}  // namespace tce
