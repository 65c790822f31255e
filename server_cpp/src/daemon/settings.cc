#include "daemon/settings.h"

#include <cctype>
#include <cstdlib>
#include <set>
#include <sstream>

#include "common/logging.h"
#include "cache/memory_backing.h"
#include "common/strings.h"
#include "meta/meta_store.h"
#include "rpc/range_buffers.h"
#include "storage/backends.h"

namespace tce {
namespace {

// Checks of string settings: why a value is refused, "" when it is accepted.

std::string SocketPath(const std::string& v) {
  if (v.empty() || v[0] != '/') return "must be an absolute path";
  if (v.size() + 3 >= 108) return "too long for a Unix socket path";  // and "<v>.fd"
  return "";
}

std::string AbsolutePath(const std::string& v) {
  return !v.empty() && v[0] == '/' ? "" : "must be an absolute path";
}

std::string EmptyOrAbsolutePath(const std::string& v) { return v.empty() ? "" : AbsolutePath(v); }

std::string Budget(const std::string& v) {
  uint64_t ignored;
  MemoryLimits any;  // a 1 TiB machine with no cgroup: only the syntax is checked
  any.mem_total = uint64_t{1} << 40;
  return ResolveBudget(v, any, &ignored).ok()
             ? ""
             : "a size like 8GiB, a percentage like 50%, or auto";
}

std::string MetadataSize(const std::string& v) {
  uint64_t ignored;
  return v == "auto" || (ParseSize(v, &ignored) && ignored > 0) ? "" : "a size like 256MiB, or auto";
}

std::string BackingKind(const std::string& v) {
  return ValidBackingSetting(v) ? "" : "auto, hugetlb, thp or 4k";
}

std::string Prealloc(const std::string& v) {
  uint64_t ignored;
  return v == "auto" || ParseSize(v, &ignored) ? "" : "a size like 4GiB, 0 (none), or auto";
}

std::string LogLevelName(const std::string& v) {
  LogLevel l;
  return ParseLogLevel(v, &l) ? "" : "debug, info, warning or error";
}

std::string LogFormatName(const std::string& v) {
  LogFormat f;
  return ParseLogFormat(v, &f) ? "" : "text or json";
}

std::string Uids(const std::string& v) {
  std::set<uid_t> ignored;
  return ParseUids(v, 0, &ignored).ok() ? "" : "comma-separated uids";
}

std::string Grants(const std::string& v) {
  ReadGrants::Ids ignored;
  return ParseReadGrants(v, &ignored).ok() ? "" : "comma-separated uid:N or gid:N";
}

std::string GroupName(const std::string& v) {
  return v.find_first_of(" \t\n:,") == std::string::npos ? "" : "a group name or gid";
}

std::string Roots(const std::string& v) {
  std::vector<std::string> dirs;
  std::vector<std::pair<std::string, std::string>> objects;
  Status s = ParseStorageRoots(v, &dirs, &objects);
  return s.ok() ? "" : "comma-separated absolute directories, or DIR=s3://BUCKET[/PREFIX] (" + s.message() + ")";
}

std::string PartSize(const std::string& v) {
  uint64_t n = 0;
  return ParseSize(v, &n) && n >= (5u << 20) && n <= (uint64_t{5} << 30) ? "" : "a size from 5MiB to 5GiB";
}

std::string RangeSize(const std::string& v) {
  uint64_t n = 0;
  return ParseSize(v, &n) && n >= (1u << 20) && n <= (uint64_t{5} << 30) ? "" : "a size from 1MiB to 5GiB";
}

std::string S3Checksum(const std::string& v) {
  return v == "crc32" || v == "md5" || v == "none" ? "" : "crc32, md5 or none";
}

std::string S3Endpoint(const std::string& v) {
  if (v.empty() || v.rfind("http://", 0) == 0 || v.rfind("https://", 0) == 0) {
    for (char c : v)
      if (static_cast<unsigned char>(c) <= 0x20 || c == 0x7f) return "a URL without spaces or control characters";
    return "";
  }
  return "http://HOST[:PORT] or https://HOST[:PORT]";
}

std::string MetadataUrl(const std::string& v) {
  return v.empty() || v == "none" || v.find("://") != std::string::npos
             ? ""
             : "sqlite:///path/tce.db, or none";
}

std::string ServerId(const std::string& v) {
  return ValidateName("server_id", v, /*allow_empty=*/true, /*allow_slash=*/true).message();
}

bool ParseInt(const std::string& s, long lo, long hi, int* out) {
  if (s.empty()) return false;
  char* end = nullptr;
  long v = std::strtol(s.c_str(), &end, 10);
  if (*end || v < lo || v > hi) return false;
  *out = static_cast<int>(v);
  return true;
}

std::string HostPort(const std::string& v) {
  if (v.empty()) return "";
  size_t colon = v.rfind(':');
  int port = 0;
  bool ok = colon != std::string::npos && colon != 0 && ParseInt(v.substr(colon + 1), 0, 65535, &port);
  return ok ? "" : "host:port";
}

std::string RingTransport(const std::string& v) { return v == "tcp" || v == "ofi" ? "" : "tcp or ofi"; }

std::string AnyValue(const std::string&) { return ""; }

std::string Secret(const std::string& v) { return v.empty() ? "" : "***"; }

// Builders of table entries, one per kind of field.

Setting Text(const char* key, std::string Options::*field, const char* arg, Setting::Check check,
             const char* help) {
  Setting s;
  s.key = key, s.arg = arg, s.field = field, s.check = check, s.help = help;
  return s;
}

Setting Int(const char* key, int Options::*field, Setting::Range range, const char* help,
            const char* arg = "N") {
  Setting s;
  if (range.want.empty())
    range.want = "an integer from " + std::to_string(range.lo) + " to " + std::to_string(range.hi);
  s.key = key, s.arg = arg, s.field = field, s.range = range, s.help = help;
  return s;
}

Setting Millis(const char* key, int Options::*field, long lo, long hi, const char* help) {
  return Int(key, field, {lo, hi, "milliseconds, " + std::to_string(lo) + " to " + std::to_string(hi)},
             help);
}

Setting Bool(const char* key, bool Options::*field, const char* help) {
  Setting s;
  s.key = key, s.arg = "B", s.field = field, s.help = help;
  return s;
}

// The settings, in the order --help, --print-config and the README's table
// list them. A new setting: its field in Options, its entry here, and its row
// in the README's table (tests/test_settings_doc.py holds the two together).
const std::vector<Setting> kSettings = {
    Text("socket", &Options::socket, "PATH", SocketPath, "gRPC socket; the fd socket is PATH.fd"),
    Text("memory_budget", &Options::memory_budget, "SIZE", Budget,
         "bytes, 8GiB, 50%, or auto (90% of the cgroup limit, else 50% of RAM)"),
    Text("memory_backing", &Options::memory_backing, "KIND", BackingKind,
         "pages of the cache's buffers: hugetlb (2 MiB pages reserved in /proc/sys/vm/nr_hugepages), "
         "thp (shmem transparent huge pages), 4k, or auto (hugetlb where huge pages are free, else "
         "thp where shmem THP is on, else 4k)"),
    Text("prealloc", &Options::prealloc, "SIZE", Prealloc,
         "memory pre-faulted in the background at start, so that first saves run at steady-state "
         "speed: a size within the budget, 0 (none), or auto (half the budget, within the memory "
         "available, the cgroup limit and the free huge pages)"),
    Text("log_level", &Options::log_level, "LEVEL", LogLevelName, "debug, info, warning or error"),
    Text("log_format", &Options::log_format, "F", LogFormatName,
         "text, or json (one object per line)"),
    Text("metrics_listen", &Options::metrics_listen, "H:P", HostPort,
         "serve Prometheus metrics at GET /metrics here")
        .DefaultText("empty: none"),
    Text("health_listen", &Options::health_listen, "H:P", HostPort,
         "serve the gRPC health service over TCP here")
        .DefaultText("empty: none"),
    Text("allowed_uids", &Options::allowed_uids, "LIST", Uids,
         "comma-separated uids that may open sessions")
        .DefaultText("empty: own uid and root"),
    Int("rpc_threads", &Options::rpc_threads, {1, 256},
        "gRPC threads waiting for calls; calls run on at most rpc_threads + max_waits + "
        "max_peer_calls + 64, more are refused (RESOURCE_EXHAUSTED)"),
    Int("max_sessions", &Options::max_sessions, {1, 65536},
        "concurrent client sessions; more connections are refused and closed at once"),
    Int("max_sessions_per_uid", &Options::max_sessions_per_uid, {1, 65536},
        "concurrent client sessions of one uid (root included); more are refused and closed at once"),
    Int("max_control_connections", &Options::max_control_connections, {1, 65536},
        "control-socket connections open at once; more are closed at once"),
    Int("max_control_connections_per_uid", &Options::max_control_connections_per_uid, {1, 65536},
        "control-socket connections of one uid (root included) open at once; more are closed at once"),
    Text("socket_group", &Options::socket_group, "G", GroupName,
         "group (name or gid) that may connect to the sockets (0660)")
        .DefaultText("empty: the server's own group"),
    Bool("root_is_admin", &Options::root_is_admin,
         "root may read, replace and remove every user's jobs"),
    Int("session_idle_timeout_s", &Options::session_idle_timeout_s,
        {0, 31536000, "seconds, 0 (never) to 31536000"},
        "close a session with no request, lease or pending save for N seconds (0: never)"),
    Int("max_waits", &Options::max_waits, {1, 65536},
        "concurrent blocked Wait calls; more are refused (RESOURCE_EXHAUSTED)"),
    Int("max_peer_calls", &Options::max_peer_calls, {1, 65536},
        "calls waiting on a ring peer at once (ranged reads, fetches, restores); more are "
        "refused at once (RESOURCE_EXHAUSTED)"),
    Int("max_peer_calls_per_uid", &Options::max_peer_calls_per_uid, {1, 65536},
        "of those, the calls of one uid (root included); more are refused at once"),
    Int("max_leases_per_session", &Options::max_leases_per_session, {1, 1000000},
        "loads one session may hold at once"),
    Int("max_waits_per_uid", &Options::max_waits_per_uid, {1, 65536},
        "of max_waits, the blocked calls of one uid (root included); more are refused at once"),
    Text("metadata_budget", &Options::metadata_budget, "SIZE", MetadataSize,
         "bytes of the server's records outside its buffers (tags, job names, read grants, version "
         "leases): a size, or auto (a quarter of the memory beside memory_budget, 16 MiB to 1 GiB)"),
    Int("metadata_share_per_uid", &Options::metadata_share_per_uid, {1, 100, "a percentage, 1 to 100"},
        "of metadata_budget, the percent one uid's records may take (root included)"),
    Int("max_jobs_per_uid", &Options::max_jobs_per_uid, {1, 1000000},
        "job names one uid (root included) may own on this server"),
    Int("max_tags_per_job", &Options::max_tags_per_job, {1, 1000000},
        "complete tags kept per job; recording one more forgets the oldest"),
    Int("max_grants_per_job", &Options::max_grants_per_job, {1, 1000000},
        "uids and gids one job's read grants may name, revoked ones included"),
    Int("max_version_leases_per_uid", &Options::max_version_leases_per_uid, {1, 1000000},
        "leases on published versions the sessions of one uid (root included) hold at once"),
    Text("read_grants", &Options::read_grants, "LIST", Grants,
         "uid:N and gid:N that may read every job's published versions (docs/weights.md); "
         "they must also be allowed to connect (allowed_uids, socket_group)")
        .DefaultText("empty: none"),
    Int("version_lease_s", &Options::version_lease_s, {1, 86400},
        "how long a reader's lease on a published version lasts unless renewed, when it asks for none"),
    Int("version_lease_max_s", &Options::version_lease_max_s, {1, 31536000},
        "the longest version lease granted (longer asks are cut to it)"),
    Int("max_follows", &Options::max_follows, {1, 4096},
        "jobs this node follows at once (weights.follow, docs/weights.md); more are refused (RESOURCE_EXHAUSTED)"),
    Int("max_follows_per_uid", &Options::max_follows_per_uid, {1, 4096},
        "of those, the jobs one uid (root included) follows; more are refused at once"),
    Int("max_range_buffers_per_uid", &Options::max_range_buffers_per_uid,
        {1, static_cast<long>(RangeBuffers::kMax)},
        "range buffers (64 MiB each, within the memory budget) the sessions of one uid (root "
        "included) hold at once; its other sessions read ranges through the reply"),
    Text("storage_roots", &Options::storage_roots, "LIST", Roots,
         "comma-separated dirs files are persisted under, or DIR=s3://BUCKET[/PREFIX]: paths under DIR "
         "are objects of BUCKET under PREFIX; only paths under a root are accepted")
        .DefaultText("empty: memory only"),
    Int("storage_keep_last", &Options::storage_keep_last, {0, 1000000, "an integer >= 0"},
        "per job, delete the files of tags older than the newest N from object storage, the "
        "tag's marker (.metadata, latest) first (0: never delete)"),
    Text("s3_endpoint", &Options::s3_endpoint, "URL", S3Endpoint,
         "the S3 API endpoint (MinIO, Ceph RGW, GCS XML API...)")
        .DefaultText("empty: https://s3.<s3_region>.amazonaws.com"),
    Text("s3_region", &Options::s3_region, "R", AnyValue, "the region requests are signed for"),
    Bool("s3_path_style", &Options::s3_path_style,
         "address buckets as ENDPOINT/BUCKET/KEY (most S3-compatible stores) instead of BUCKET.HOST/KEY"),
    Bool("s3_verify_tls", &Options::s3_verify_tls, "verify the endpoint's TLS certificate and name"),
    Text("s3_ca_file", &Options::s3_ca_file, "F", EmptyOrAbsolutePath, "CA certificates (PEM) to verify with")
        .DefaultText("empty: the system's"),
    Text("s3_credentials_file", &Options::s3_credentials_file, "F", EmptyOrAbsolutePath,
         "an AWS shared-credentials file (the keys in it are never printed or logged)")
        .DefaultText("empty: AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_SESSION_TOKEN"),
    Text("s3_profile", &Options::s3_profile, "P", AnyValue, "the profile of s3_credentials_file"),
    Text("s3_part_size", &Options::s3_part_size, "SIZE", PartSize,
         "objects larger than this go up as multipart uploads of parts this size"),
    Text("s3_range_size", &Options::s3_range_size, "SIZE", RangeSize,
         "a load fetches an object in ranged GETs of this size"),
    Int("s3_parallel", &Options::s3_parallel, {1, 64}, "parts (or ranges) in flight per file"),
    Int("s3_retries", &Options::s3_retries, {0, 100},
        "retries of an S3 request that failed for a reason that may clear (5xx, SlowDown, timeouts)"),
    Int("s3_backoff_ms", &Options::s3_backoff_ms, {1, 600000},
        "first S3 retry's delay bound: full jitter, doubled per retry, at most 20 s"),
    Millis("s3_request_timeout_ms", &Options::s3_request_timeout_ms, 1, 86400000,
           "the most one S3 request may take, its retries and their backoff included; then it fails "
           "and the file is persisted again after persist_failed_retry_ms"),
    Text("s3_checksum", &Options::s3_checksum, "C", S3Checksum,
         "how the store checks each body it receives: crc32 (x-amz-checksum-crc32), md5 (Content-MD5, "
         "for stores without checksums) or none"),
    Int("persist_threads", &Options::persist_threads, {1, 64},
        "persistence workers for the directory roots, and as many for each object root"),
    Int("persist_retries", &Options::persist_retries, {0, 100}, "retries of a failed write"),
    Millis("persist_backoff_ms", &Options::persist_backoff_ms, 1, 600000,
           "first retry delay, doubled each time"),
    Millis("storage_check_timeout_ms", &Options::storage_check_timeout_ms, 0, 600000,
           "a load waits this long for storage to say whether its file changed there, then "
           "serves the cache (0: no limit)"),
    Millis("persist_failed_retry_ms", &Options::persist_failed_retry_ms, 0, 86400000,
           "persist a file that failed for a reason that may clear (disk full, I/O) again this "
           "often (0: never)"),
    Text("state_dir", &Options::state_dir, "DIR", AbsolutePath, "the server's own files (metadata)"),
    Text("metadata_url", &Options::metadata_url, "URL", MetadataUrl,
         "where file states are recorded: sqlite:///path/tce.db, mysql://user:pass@host:port/db, "
         "or none")
        .DefaultText("sqlite://<state_dir>/tce.db")
        .Shown(RedactUrl),
    Text("server_id", &Options::server_id, "ID", ServerId,
         "this server's rows in a metadata database that several servers share")
        .DefaultText("<hostname>:<socket>"),
    Int("keep_last", &Options::keep_last, {0, 1000000, "an integer >= 0"},
        "per job, evict persisted files of tags older than the newest N (0: keep while there is "
        "room)"),
    Bool("persist_direct_io", &Options::persist_direct_io, "write with O_DIRECT where supported"),
    Int("persist_io_depth", &Options::persist_io_depth, {1, 64}, "O_DIRECT writes in flight per file"),
    Millis("drain_timeout_ms", &Options::drain_timeout_ms, 0, 86400000,
           "on SIGTERM, keep persisting and backing up what is cached at most N ms"),
    Millis("cache_full_timeout_ms", &Options::cache_full_timeout_ms, 0, 3600000,
           "how long a save into a full cache waits for persistence to free room"),
    Text("peer_listen", &Options::peer_listen, "H:P", HostPort,
         "join rings: listen for peer servers here")
        .DefaultText("empty: no ring"),
    Text("peer_advertise", &Options::peer_advertise, "H:P", HostPort, "the endpoint peers use")
        .DefaultText("the bound peer_listen"),
    Text("peer_token", &Options::peer_token, "T", AnyValue,
         "the cluster token peers prove (never printed)")
        .Shown(Secret),
    Text("peer_token_file", &Options::peer_token_file, "F", EmptyOrAbsolutePath,
         "read the token from F"),
    Text("peer_cert_file", &Options::peer_cert_file, "F", EmptyOrAbsolutePath,
         "this node's certificate (PEM), signed by the cluster CA: peers then prove which node "
         "they are with theirs (with peer_key_file, peer_ca_file)")
        .DefaultText("empty: the token alone"),
    Text("peer_key_file", &Options::peer_key_file, "F", EmptyOrAbsolutePath,
         "the private key (PEM) of peer_cert_file"),
    Text("peer_ca_file", &Options::peer_ca_file, "F", EmptyOrAbsolutePath,
         "the cluster CA certificate(s) (PEM) every node certificate must chain to"),
    Text("ring_transport", &Options::ring_transport, "T", RingTransport,
         "tcp, or ofi (libfabric RMA)"),
    Int("ring_streams", &Options::ring_streams, {1, 16}, "tcp: connections per ring link"),
    Text("ofi_provider", &Options::ofi_provider, "P", AnyValue,
         "ofi: the libfabric provider (verbs, efa, tcp...); devices: TCE_RDMA_DEVICES, else "
         "NCCL_IB_HCA")
        .DefaultText("empty: the first provider with RMA"),
    Int("backup_share", &Options::backup_share, {1, 90, "a percentage from 1 to 90"},
        "% of the memory budget for predecessors' backups", "PCT"),
    Int("backup_threads", &Options::backup_threads, {1, 64}, "backup workers"),
    Bool("cooperative_restore", &Options::cooperative_restore,
         "a file a load misses is read from storage once: by one node of the job's ring (the others "
         "pull it), and once per node for its ranks"),
    Bool("restore_prefetch", &Options::restore_prefetch,
         "a ring set on a node holding none of the job's files starts reading its share of the newest tag"),
    Millis("peer_timeout_ms", &Options::peer_timeout_ms, 100, 3600000,
           "give up on a silent peer after N ms"),
    Millis("peer_handshake_timeout_ms", &Options::peer_handshake_timeout_ms, 100, 600000,
           "a peer authenticates within N ms"),
    Int("peer_max_connections", &Options::peer_max_connections, {2, 65536},
        "authenticated peer links (lanes included)"),
    Int("peer_max_handshakes", &Options::peer_max_handshakes, {1, 65536},
        "connections authenticating at once"),
    Int("peer_max_handshakes_per_source", &Options::peer_max_handshakes_per_source, {1, 65536},
        "of those, from one address"),
    Millis("ring_restore_wait_ms", &Options::ring_restore_wait_ms, 0, 3600000,
           "a load waits at most N ms for its job's files to come back from the ring"),
};

std::string Quote(const std::string& s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') out += '\\';
    out += c;
  }
  return out + "\"";
}

// The value of `s` in `o`, as --print-config writes it.
std::string Printed(const Setting& s, const Options& o) {
  if (auto f = std::get_if<int Options::*>(&s.field)) return std::to_string(o.**f);
  if (auto f = std::get_if<bool Options::*>(&s.field)) return o.**f ? "true" : "false";
  const std::string& v = o.*std::get<std::string Options::*>(s.field);
  return Quote(s.show ? s.show(v) : v);
}

// --help's default of `s`.
std::string DefaultShown(const Setting& s) {
  if (s.default_text) return s.default_text;
  static const Options defaults;
  if (auto f = std::get_if<std::string Options::*>(&s.field))
    return (defaults.**f).empty() ? "empty" : defaults.**f;
  return Printed(s, defaults);
}

constexpr size_t kHelpIndent = 30, kHelpWidth = 80;

// One --help entry: the flag, its text wrapped beside it, then
// "[ENV, default]" on a line of its own.
void AppendHelp(const std::string& flag, const std::string& text, const std::string& where,
                std::string* out) {
  std::string line = "  " + flag;
  const std::string indent(kHelpIndent, ' ');
  auto flush = [&] {
    *out += line.substr(0, line.find_last_not_of(' ') + 1) + "\n";
    line = indent;
  };
  std::istringstream words(text);
  std::string word;
  bool first = true;  // no word on `line` yet
  if (line.size() + 2 > kHelpIndent) {
    flush();
  } else {
    line.resize(kHelpIndent, ' ');
  }
  while (words >> word) {
    if (!first && line.size() + 1 + word.size() > kHelpWidth) {
      flush();
      first = true;
    }
    line += (first ? "" : " ") + word;
    first = false;
  }
  flush();
  if (!where.empty()) *out += indent + "[" + where + "]\n";
}

}  // namespace

std::string Setting::Env() const {
  std::string env = "TCE_";
  for (const char* c = key; *c; ++c) env += static_cast<char>(std::toupper(static_cast<unsigned char>(*c)));
  return env;
}

std::string Setting::Flag() const {
  std::string flag = "--";
  for (const char* c = key; *c; ++c) flag += *c == '_' ? '-' : *c;
  return flag;
}

const std::vector<Setting>& Settings() { return kSettings; }

const Setting* FindSetting(const std::string& key) {
  for (const Setting& s : kSettings)
    if (key == s.key) return &s;
  return nullptr;
}

Status SetOption(Options* o, const std::string& key, const std::string& value) {
  const Setting* s = FindSetting(key);
  if (!s) return Status::InvalidArgument("unknown setting '" + key + "'");
  std::string why;
  if (auto f = std::get_if<int Options::*>(&s->field)) {
    if (!ParseInt(value, s->range.lo, s->range.hi, &(o->**f))) why = s->range.want;
  } else if (auto f = std::get_if<bool Options::*>(&s->field)) {
    if (value == "true" || value == "false") o->**f = value == "true";
    else why = "true or false";
  } else {
    why = s->check ? s->check(value) : "";
    if (why.empty()) o->*std::get<std::string Options::*>(s->field) = value;
  }
  if (!why.empty())
    return Status::InvalidArgument("bad value for " + key + ": '" + value + "' (" + why + ")");
  return Status::OK();
}

std::string FormatConfig(const Options& o) {
  std::string out = "# tce-server effective configuration\n";
  for (const Setting& s : kSettings) out += std::string(s.key) + " = " + Printed(s, o) + "\n";
  return out;
}

std::string HelpText() {
  std::string out =
      "usage: tce-server [flags]\n"
      "\n"
      "The TCE per-node checkpoint cache server.\n"
      "Precedence: defaults < --config FILE (or TCE_CONFIG) < TCE_* environment < flags.\n"
      "Each setting: its flag, what it sets, then [environment variable, default];\n"
      "its config-file key is the flag's name with _ for -.\n"
      "\n";
  for (const Setting& s : kSettings)
    AppendHelp(s.Flag() + " " + s.arg, s.help, s.Env() + ", " + DefaultShown(s), &out);
  AppendHelp("--config FILE", "flat TOML config file", "TCE_CONFIG", &out);
  AppendHelp("--print-config", "print the effective configuration and exit", "", &out);
  AppendHelp("--fabric-info", "print the fabric devices and providers (JSON) and exit", "", &out);
  AppendHelp("--version, --help", "", "", &out);
  return out;
}

}  // namespace tce
