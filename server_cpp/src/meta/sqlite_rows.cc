// SqliteStore: the rows: a batch of changes written in one transaction, the
// files, tags and rings read back (a damaged row skipped), the heartbeat.
#include <sqlite3.h>

#include "common/logging.h"
#include "common/validate.h"
#include "meta/row_codec.h"
#include "meta/sqlite_store_internal.h"

namespace tce {
namespace sqlite {

Status SqliteStore::ApplyFile(const FileInfo& f) {
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

Status SqliteStore::Apply(const std::vector<MetaChange>& batch) {
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

Status SqliteStore::ApplyTag(const TagInfo& t) {
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

Status SqliteStore::ApplyRing(const RingInfo& r) {
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

Status SqliteStore::LoadFiles(std::vector<FileInfo>* out) {
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

Status SqliteStore::LoadRings(const std::string& self, std::vector<RingInfo>* out) {
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

Status SqliteStore::LoadTags(std::vector<TagInfo>* out) {
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

Status SqliteStore::Heartbeat(const std::string& endpoint, int64_t pid) {
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

std::string SqliteStore::Text(sqlite3_stmt* q, int i) {
  const unsigned char* t = sqlite3_column_text(q, i);
  return t ? std::string(reinterpret_cast<const char*>(t), static_cast<size_t>(sqlite3_column_bytes(q, i)))
           : std::string();
}

bool SqliteStore::Int(sqlite3_stmt* q, int i, int64_t* out) {
  if (sqlite3_column_type(q, i) != SQLITE_INTEGER) return false;
  *out = sqlite3_column_int64(q, i);
  return true;
}

void SqliteStore::Skip(const char* table, const std::string& key, const Status& why) {
  TCE_LOG(kError, "meta") << "skipping a damaged row of table " << table << " (" << key
                          << "): " << why.message();
}

void SqliteStore::Bind(sqlite3_stmt* s, std::initializer_list<std::string> texts) {
  sqlite3_reset(s);
  sqlite3_clear_bindings(s);
  int i = 1;
  for (const std::string& t : texts) BindText(s, i++, t);
}

void SqliteStore::BindText(sqlite3_stmt* s, int i, const std::string& t) {
  sqlite3_bind_text64(s, i, t.data(), t.size(), SQLITE_TRANSIENT, SQLITE_UTF8);
}

Status SqliteStore::Step(sqlite3_stmt* s) {
  int rc = sqlite3_step(s);
  sqlite3_reset(s);
  return rc == SQLITE_DONE || rc == SQLITE_ROW ? Status::OK() : Fail("write");
}

}  // namespace sqlite
}  // namespace tce
