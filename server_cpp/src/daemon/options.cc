#include "daemon/options.h"

#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <sstream>

#include "common/logging.h"
#include "common/strings.h"
#include "meta/meta_store.h"

namespace tce {
namespace {

struct Setting {
  const char* key;
  const char* env;
  const char* flag;
};
const Setting kSettings[] = {
    {"socket", "TCE_SOCKET", "--socket"},
    {"memory_budget", "TCE_MEMORY_BUDGET", "--memory-budget"},
    {"log_level", "TCE_LOG_LEVEL", "--log-level"},
    {"log_format", "TCE_LOG_FORMAT", "--log-format"},
    {"metrics_listen", "TCE_METRICS_LISTEN", "--metrics-listen"},
    {"health_listen", "TCE_HEALTH_LISTEN", "--health-listen"},
    {"allowed_uids", "TCE_ALLOWED_UIDS", "--allowed-uids"},
    {"rpc_threads", "TCE_RPC_THREADS", "--rpc-threads"},
    {"max_sessions", "TCE_MAX_SESSIONS", "--max-sessions"},
    {"max_control_connections", "TCE_MAX_CONTROL_CONNECTIONS", "--max-control-connections"},
    {"socket_group", "TCE_SOCKET_GROUP", "--socket-group"},
    {"root_is_admin", "TCE_ROOT_IS_ADMIN", "--root-is-admin"},
    {"session_idle_timeout_s", "TCE_SESSION_IDLE_TIMEOUT_S", "--session-idle-timeout-s"},
    {"max_waits", "TCE_MAX_WAITS", "--max-waits"},
    {"max_leases_per_session", "TCE_MAX_LEASES_PER_SESSION", "--max-leases-per-session"},
    {"storage_roots", "TCE_STORAGE_ROOTS", "--storage-roots"},
    {"persist_threads", "TCE_PERSIST_THREADS", "--persist-threads"},
    {"persist_retries", "TCE_PERSIST_RETRIES", "--persist-retries"},
    {"persist_backoff_ms", "TCE_PERSIST_BACKOFF_MS", "--persist-backoff-ms"},
    {"cache_full_timeout_ms", "TCE_CACHE_FULL_TIMEOUT_MS", "--cache-full-timeout-ms"},
    {"persist_direct_io", "TCE_PERSIST_DIRECT_IO", "--persist-direct-io"},
    {"persist_io_depth", "TCE_PERSIST_IO_DEPTH", "--persist-io-depth"},
    {"persist_failed_retry_ms", "TCE_PERSIST_FAILED_RETRY_MS", "--persist-failed-retry-ms"},
    {"storage_check_timeout_ms", "TCE_STORAGE_CHECK_TIMEOUT_MS", "--storage-check-timeout-ms"},
    {"drain_timeout_ms", "TCE_DRAIN_TIMEOUT_MS", "--drain-timeout-ms"},
    {"keep_last", "TCE_KEEP_LAST", "--keep-last"},
    {"state_dir", "TCE_STATE_DIR", "--state-dir"},
    {"metadata_url", "TCE_METADATA_URL", "--metadata-url"},
    {"server_id", "TCE_SERVER_ID", "--server-id"},
    {"peer_listen", "TCE_PEER_LISTEN", "--peer-listen"},
    {"peer_advertise", "TCE_PEER_ADVERTISE", "--peer-advertise"},
    {"peer_token", "TCE_PEER_TOKEN", "--peer-token"},
    {"peer_token_file", "TCE_PEER_TOKEN_FILE", "--peer-token-file"},
    {"ring_transport", "TCE_RING_TRANSPORT", "--ring-transport"},
    {"ofi_provider", "TCE_OFI_PROVIDER", "--ofi-provider"},
    {"ring_streams", "TCE_RING_STREAMS", "--ring-streams"},
    {"backup_share", "TCE_BACKUP_SHARE", "--backup-share"},
    {"backup_threads", "TCE_BACKUP_THREADS", "--backup-threads"},
    {"peer_timeout_ms", "TCE_PEER_TIMEOUT_MS", "--peer-timeout-ms"},
    {"peer_handshake_timeout_ms", "TCE_PEER_HANDSHAKE_TIMEOUT_MS", "--peer-handshake-timeout-ms"},
    {"peer_max_connections", "TCE_PEER_MAX_CONNECTIONS", "--peer-max-connections"},
    {"peer_max_handshakes", "TCE_PEER_MAX_HANDSHAKES", "--peer-max-handshakes"},
    {"peer_max_handshakes_per_source", "TCE_PEER_MAX_HANDSHAKES_PER_SOURCE", "--peer-max-handshakes-per-source"},
    {"ring_fault", "TCE_RING_FAULT", "--ring-fault"},
};

bool ParseInt(const std::string& s, long lo, long hi, int* out) {
  if (s.empty()) return false;
  char* end = nullptr;
  long v = std::strtol(s.c_str(), &end, 10);
  if (*end || v < lo || v > hi) return false;
  *out = static_cast<int>(v);
  return true;
}

std::string Trim(const std::string& s) {
  size_t b = s.find_first_not_of(" \t\r"), e = s.find_last_not_of(" \t\r");
  return b == std::string::npos ? "" : s.substr(b, e - b + 1);
}

std::string Quote(const std::string& s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') out += '\\';
    out += c;
  }
  return out + "\"";
}

}  // namespace

Status SetOption(Options* o, const std::string& key, const std::string& value) {
  auto bad = [&](const std::string& why) {
    return Status::InvalidArgument("bad value for " + key + ": '" + value + "' (" + why + ")");
  };
  if (key == "socket") {
    if (value.empty() || value[0] != '/') return bad("must be an absolute path");
    if (value.size() + 3 >= 108) return bad("too long for a Unix socket path");
    o->socket = value;
  } else if (key == "memory_budget") {
    uint64_t ignored;
    Status s = ResolveBudget(value, MemoryLimits{0, uint64_t{1} << 40}, &ignored);
    if (!s.ok()) return bad("a size like 8GiB, a percentage like 50%, or auto");
    o->memory_budget = value;
  } else if (key == "log_level") {
    LogLevel l;
    if (!ParseLogLevel(value, &l)) return bad("debug, info, warning or error");
    o->log_level = value;
  } else if (key == "log_format") {
    LogFormat f;
    if (!ParseLogFormat(value, &f)) return bad("text or json");
    o->log_format = value;
  } else if (key == "allowed_uids") {
    std::set<uid_t> ignored;
    if (!ParseUids(value, 0, &ignored).ok()) return bad("comma-separated uids");
    o->allowed_uids = value;
  } else if (key == "rpc_threads") {
    if (!ParseInt(value, 1, 256, &o->rpc_threads)) return bad("an integer from 1 to 256");
  } else if (key == "max_control_connections") {
    if (!ParseInt(value, 1, 65536, &o->max_control_connections)) return bad("an integer from 1 to 65536");
  } else if (key == "max_sessions") {
    if (!ParseInt(value, 1, 65536, &o->max_sessions)) return bad("an integer from 1 to 65536");
  } else if (key == "socket_group") {
    if (value.find_first_of(" \t\n:,") != std::string::npos) return bad("a group name or gid");
    o->socket_group = value;
  } else if (key == "root_is_admin") {
    if (value != "true" && value != "false") return bad("true or false");
    o->root_is_admin = value == "true";
  } else if (key == "session_idle_timeout_s") {
    if (!ParseInt(value, 0, 31536000, &o->session_idle_timeout_s))
      return bad("seconds, 0 (never) to 31536000");
  } else if (key == "max_waits") {
    if (!ParseInt(value, 1, 65536, &o->max_waits)) return bad("an integer from 1 to 65536");
  } else if (key == "max_leases_per_session") {
    if (!ParseInt(value, 1, 1000000, &o->max_leases_per_session))
      return bad("an integer from 1 to 1000000");
  } else if (key == "storage_roots") {
    std::vector<std::string> ignored;
    if (!ParseRoots(value, &ignored).ok()) return bad("comma-separated absolute directories");
    o->storage_roots = value;
  } else if (key == "persist_threads") {
    if (!ParseInt(value, 1, 64, &o->persist_threads)) return bad("an integer from 1 to 64");
  } else if (key == "persist_retries") {
    if (!ParseInt(value, 0, 100, &o->persist_retries)) return bad("an integer from 0 to 100");
  } else if (key == "persist_backoff_ms") {
    if (!ParseInt(value, 1, 600000, &o->persist_backoff_ms)) return bad("milliseconds, 1 to 600000");
  } else if (key == "state_dir") {
    if (value.empty() || value[0] != '/') return bad("must be an absolute path");
    o->state_dir = value;
  } else if (key == "metadata_url") {
    if (!value.empty() && value != "none" && value.find("://") == std::string::npos)
      return bad("sqlite:///path/tce.db, or none");
    o->metadata_url = value;
  } else if (key == "server_id") {
    Status valid = ValidateName("server_id", value, /*allow_empty=*/true, /*allow_slash=*/true);
    if (!valid.ok()) return bad(valid.message());
    o->server_id = value;
  } else if (key == "keep_last") {
    if (!ParseInt(value, 0, 1000000, &o->keep_last)) return bad("an integer >= 0");
  } else if (key == "drain_timeout_ms") {
    if (!ParseInt(value, 0, 86400000, &o->drain_timeout_ms)) return bad("milliseconds, 0 to 86400000");
  } else if (key == "persist_io_depth") {
    if (!ParseInt(value, 1, 64, &o->persist_io_depth)) return bad("an integer from 1 to 64");
  } else if (key == "persist_direct_io") {
    if (value != "true" && value != "false") return bad("true or false");
    o->persist_direct_io = value == "true";
  } else if (key == "cache_full_timeout_ms") {
    if (!ParseInt(value, 0, 3600000, &o->cache_full_timeout_ms))
      return bad("milliseconds, 0 to 3600000");
  } else if (key == "peer_listen" || key == "peer_advertise" || key == "metrics_listen" ||
             key == "health_listen") {
    if (!value.empty()) {
      size_t colon = value.rfind(':');
      int port = 0;
      if (colon == std::string::npos || colon == 0 || !ParseInt(value.substr(colon + 1), 0, 65535, &port))
        return bad("host:port");
    }
    (key == "peer_listen"      ? o->peer_listen
     : key == "peer_advertise" ? o->peer_advertise
     : key == "metrics_listen" ? o->metrics_listen
                               : o->health_listen) = value;
  } else if (key == "peer_token") {
    o->peer_token = value;
  } else if (key == "peer_token_file") {
    if (!value.empty() && value[0] != '/') return bad("must be an absolute path");
    o->peer_token_file = value;
  } else if (key == "ring_transport") {
    if (value != "tcp" && value != "ofi") return bad("tcp or ofi");
    o->ring_transport = value;
  } else if (key == "ofi_provider") {
    o->ofi_provider = value;
  } else if (key == "ring_streams") {
    if (!ParseInt(value, 1, 16, &o->ring_streams)) return bad("an integer from 1 to 16");
  } else if (key == "backup_share") {
    if (!ParseInt(value, 1, 90, &o->backup_share)) return bad("a percentage from 1 to 90");
  } else if (key == "ring_fault") {
    if (!value.empty() && value != "corrupt") return bad("empty, or corrupt (tests only)");
    o->ring_fault = value;
  } else if (key == "peer_timeout_ms") {
    if (!ParseInt(value, 100, 3600000, &o->peer_timeout_ms)) return bad("milliseconds, 100 to 3600000");
  } else if (key == "storage_check_timeout_ms") {
    if (!ParseInt(value, 0, 600000, &o->storage_check_timeout_ms)) return bad("milliseconds, 0 to 600000");
  } else if (key == "persist_failed_retry_ms") {
    if (!ParseInt(value, 0, 86400000, &o->persist_failed_retry_ms)) return bad("milliseconds, 0 to 86400000");
  } else if (key == "peer_handshake_timeout_ms") {
    if (!ParseInt(value, 100, 600000, &o->peer_handshake_timeout_ms)) return bad("milliseconds, 100 to 600000");
  } else if (key == "peer_max_connections") {
    if (!ParseInt(value, 2, 65536, &o->peer_max_connections)) return bad("an integer from 2 to 65536");
  } else if (key == "peer_max_handshakes") {
    if (!ParseInt(value, 1, 65536, &o->peer_max_handshakes)) return bad("an integer from 1 to 65536");
  } else if (key == "peer_max_handshakes_per_source") {
    if (!ParseInt(value, 1, 65536, &o->peer_max_handshakes_per_source)) return bad("an integer from 1 to 65536");
  } else if (key == "backup_threads") {
    if (!ParseInt(value, 1, 64, &o->backup_threads)) return bad("an integer from 1 to 64");
  } else {
    return Status::InvalidArgument("unknown setting '" + key + "'");
  }
  return Status::OK();
}

Status ParseConfigText(const std::string& text, const std::string& name,
                       std::vector<std::pair<std::string, std::string>>* out) {
  std::istringstream in(text);
  std::string line;
  for (int n = 1; std::getline(in, line); ++n) {
    auto where = [&] { return name + " line " + std::to_string(n) + ": "; };
    // Strip a comment that is not inside a string.
    bool quoted = false;
    for (size_t i = 0; i < line.size(); ++i) {
      if (line[i] == '\\' && quoted) ++i;
      else if (line[i] == '"') quoted = !quoted;
      else if (line[i] == '#' && !quoted) {
        line.resize(i);
        break;
      }
    }
    line = Trim(line);
    if (line.empty()) continue;
    size_t eq = line.find('=');
    if (eq == std::string::npos) return Status::InvalidArgument(where() + "expected key = value");
    std::string key = Trim(line.substr(0, eq)), raw = Trim(line.substr(eq + 1));
    bool known = false;
    for (const Setting& s : kSettings) known = known || key == s.key;
    if (!known) return Status::InvalidArgument(where() + "unknown key '" + key + "'");
    std::string value;
    if (!raw.empty() && raw[0] == '"') {
      size_t i = 1;
      for (; i < raw.size() && raw[i] != '"'; ++i) {
        if (raw[i] == '\\' && i + 1 < raw.size()) ++i;
        value += raw[i];
      }
      if (i >= raw.size() || Trim(raw.substr(i + 1)) != "")
        return Status::InvalidArgument(where() + "unterminated string or trailing text");
    } else {
      value = raw;  // integer or true/false; SetOption validates
      if (value.empty()) return Status::InvalidArgument(where() + "missing value for " + key);
    }
    out->emplace_back(key, value);
  }
  return Status::OK();
}

Status ParseOptions(const std::vector<std::string>& args,
                    const std::map<std::string, std::string>& env, Options* out, Action* action) {
  *action = Action::kRun;
  // Flags first (collected), so that --config is known before the file is read.
  std::vector<std::pair<std::string, std::string>> flags;
  std::string config;
  if (auto it = env.find("TCE_CONFIG"); it != env.end()) config = it->second;
  for (size_t i = 0; i < args.size(); ++i) {
    std::string a = args[i], value;
    if (a == "--help" || a == "-h") { *action = Action::kHelp; return Status::OK(); }
    if (a == "--version") { *action = Action::kVersion; return Status::OK(); }
    if (a == "--print-config") { *action = Action::kPrintConfig; continue; }
    if (a == "--fabric-info") { *action = Action::kFabricInfo; continue; }
    size_t eq = a.find('=');
    std::string name = a.substr(0, eq);
    bool is_config = name == "--config";
    const Setting* setting = nullptr;
    for (const Setting& s : kSettings)
      if (name == s.flag) setting = &s;
    if (!setting && !is_config) return Status::InvalidArgument("unknown flag '" + a + "' (see --help)");
    if (eq != std::string::npos) value = a.substr(eq + 1);
    else if (i + 1 < args.size()) value = args[++i];
    else return Status::InvalidArgument("flag " + name + " needs a value");
    if (is_config) config = value;
    else flags.emplace_back(setting->key, value);
  }
  Options o;
  if (!config.empty()) {
    std::ifstream f(config);
    if (!f) return Status::InvalidArgument("cannot read config file " + config);
    std::stringstream ss;
    ss << f.rdbuf();
    std::vector<std::pair<std::string, std::string>> kv;
    Status s = ParseConfigText(ss.str(), config, &kv);
    for (const auto& [k, v] : kv) {
      if (!s.ok()) break;
      s = SetOption(&o, k, v);
      if (!s.ok()) s = Status::InvalidArgument(config + ": " + s.message());
    }
    if (!s.ok()) return s;
    o.config = config;
  }
  for (const Setting& st : kSettings) {
    auto it = env.find(st.env);
    if (it == env.end() || it->second.empty()) continue;
    Status s = SetOption(&o, st.key, it->second);
    if (!s.ok()) return Status::InvalidArgument(std::string(st.env) + ": " + s.message());
  }
  for (const auto& [k, v] : flags) {
    Status s = SetOption(&o, k, v);
    if (!s.ok()) return s;
  }
  *out = o;
  return Status::OK();
}

Status ResolveBudget(const std::string& text, const MemoryLimits& limits, uint64_t* out) {
  uint64_t detected = limits.cgroup_limit ? limits.cgroup_limit : limits.mem_total;
  if (text == "auto") {
    *out = AutoBudget(limits);
  } else if (!text.empty() && text.back() == '%') {
    char* end = nullptr;
    double pct = std::strtod(text.c_str(), &end);
    if (end != text.c_str() + text.size() - 1 || !(pct > 0 && pct <= 100))
      return Status::InvalidArgument("bad percentage " + text);
    *out = static_cast<uint64_t>(static_cast<double>(detected) * pct / 100);
  } else if (!ParseSize(text, out)) {
    return Status::InvalidArgument("bad size " + text);
  }
  if (*out == 0) return Status::InvalidArgument("memory budget is zero");
  return Status::OK();
}

std::string EffectiveServerId(const Options& o) {
  if (!o.server_id.empty()) return o.server_id;
  char host[256] = {};
  if (gethostname(host, sizeof(host) - 1) != 0) host[0] = '\0';
  return std::string(host) + ":" + o.socket;
}

std::string EffectiveMetadataUrl(const Options& o) {
  if (o.metadata_url == "none") return "";
  if (!o.metadata_url.empty()) return o.metadata_url;
  return "sqlite://" + o.state_dir + "/tce.db";
}

Status ParseRoots(const std::string& text, std::vector<std::string>* out) {
  out->clear();
  std::stringstream ss(text);
  std::string part;
  while (std::getline(ss, part, ',')) {
    part = Trim(part);
    if (part.empty()) continue;
    if (part[0] != '/') return Status::InvalidArgument("storage root must be absolute: " + part);
    while (part.size() > 1 && part.back() == '/') part.pop_back();
    out->push_back(part);
  }
  return Status::OK();
}

Status ParseUids(const std::string& text, uid_t self, std::set<uid_t>* out) {
  out->clear();
  if (Trim(text).empty()) {
    out->insert(self);
    out->insert(0);
    return Status::OK();
  }
  std::stringstream ss(text);
  std::string part;
  while (std::getline(ss, part, ',')) {
    part = Trim(part);
    char* end = nullptr;
    unsigned long v = std::strtoul(part.c_str(), &end, 10);
    if (part.empty() || *end || v > 0xFFFFFFFEul) return Status::InvalidArgument("bad uid '" + part + "'");
    out->insert(static_cast<uid_t>(v));
  }
  return Status::OK();
}

std::string FormatConfig(const Options& o) {
  std::ostringstream out;
  out << "# tce-server effective configuration\n"
      << "socket = " << Quote(o.socket) << "\n"
      << "memory_budget = " << Quote(o.memory_budget) << "\n"
      << "log_level = " << Quote(o.log_level) << "\n"
      << "log_format = " << Quote(o.log_format) << "\n"
      << "metrics_listen = " << Quote(o.metrics_listen) << "\n"
      << "health_listen = " << Quote(o.health_listen) << "\n"
      << "allowed_uids = " << Quote(o.allowed_uids) << "\n"
      << "rpc_threads = " << o.rpc_threads << "\n"
      << "max_sessions = " << o.max_sessions << "\n"
      << "max_control_connections = " << o.max_control_connections << "\n"
      << "socket_group = " << Quote(o.socket_group) << "\n"
      << "root_is_admin = " << (o.root_is_admin ? "true" : "false") << "\n"
      << "session_idle_timeout_s = " << o.session_idle_timeout_s << "\n"
      << "max_waits = " << o.max_waits << "\n"
      << "max_leases_per_session = " << o.max_leases_per_session << "\n"
      << "storage_roots = " << Quote(o.storage_roots) << "\n"
      << "persist_threads = " << o.persist_threads << "\n"
      << "persist_retries = " << o.persist_retries << "\n"
      << "persist_backoff_ms = " << o.persist_backoff_ms << "\n"
      << "cache_full_timeout_ms = " << o.cache_full_timeout_ms << "\n"
      << "persist_direct_io = " << (o.persist_direct_io ? "true" : "false") << "\n"
      << "persist_io_depth = " << o.persist_io_depth << "\n"
      << "drain_timeout_ms = " << o.drain_timeout_ms << "\n"
      << "keep_last = " << o.keep_last << "\n"
      << "state_dir = " << Quote(o.state_dir) << "\n"
      << "metadata_url = " << Quote(RedactUrl(o.metadata_url)) << "\n"  // no password
      << "server_id = " << Quote(o.server_id) << "\n"
      << "peer_listen = " << Quote(o.peer_listen) << "\n"
      << "peer_advertise = " << Quote(o.peer_advertise) << "\n"
      << "peer_token = " << Quote(o.peer_token.empty() ? "" : "***") << "\n"
      << "peer_token_file = " << Quote(o.peer_token_file) << "\n"
      << "ring_transport = " << Quote(o.ring_transport) << "\n"
      << "ofi_provider = " << Quote(o.ofi_provider) << "\n"
      << "ring_streams = " << o.ring_streams << "\n"
      << "backup_share = " << o.backup_share << "\n"
      << "backup_threads = " << o.backup_threads << "\n"
      << "peer_timeout_ms = " << o.peer_timeout_ms << "\n"
      << "persist_failed_retry_ms = " << o.persist_failed_retry_ms << "\n"
      << "storage_check_timeout_ms = " << o.storage_check_timeout_ms << "\n"
      << "peer_handshake_timeout_ms = " << o.peer_handshake_timeout_ms << "\n"
      << "peer_max_connections = " << o.peer_max_connections << "\n"
      << "peer_max_handshakes = " << o.peer_max_handshakes << "\n"
      << "peer_max_handshakes_per_source = " << o.peer_max_handshakes_per_source << "\n"
      << "ring_fault = " << Quote(o.ring_fault) << "\n";
  return out.str();
}

std::string HelpText() {
  return "usage: tce-server [flags]\n"
         "\n"
         "The TCE per-node checkpoint cache server.\n"
         "Precedence: defaults < --config FILE (or TCE_CONFIG) < TCE_* environment < flags.\n"
         "\n"
         "  --socket PATH          gRPC socket; the fd socket is PATH.fd   [TCE_SOCKET, /run/tce/tce.sock]\n"
         "  --memory-budget SIZE   bytes, 8GiB, 50%, or auto (90% of the cgroup limit, else 50% of RAM)\n"
         "                                                                  [TCE_MEMORY_BUDGET, auto]\n"
         "  --log-level LEVEL      debug|info|warning|error                  [TCE_LOG_LEVEL, info]\n"
         "  --log-format F         text, or json (one object per line)       [TCE_LOG_FORMAT, text]\n"
         "  --metrics-listen H:P   serve Prometheus metrics at GET /metrics  [TCE_METRICS_LISTEN, empty: none]\n"
         "  --health-listen H:P    serve the gRPC health service over TCP    [TCE_HEALTH_LISTEN, empty: none]\n"
         "  --allowed-uids LIST    uids that may open sessions               [TCE_ALLOWED_UIDS, own uid + root]\n"
         "  --rpc-threads N        gRPC worker threads                       [TCE_RPC_THREADS, 4]\n"
         "  --max-sessions N       concurrent client sessions; more connections are\n"
         "                         refused and closed at once                [TCE_MAX_SESSIONS, 1024]\n"
         "  --max-control-connections N\n"
         "                         control-socket connections open at once; [TCE_MAX_CONTROL_CONNECTIONS, 1024]\n"
         "                         more are closed at once\n"
         "  --socket-group G       group (name or gid) that may connect to the sockets (0660)\n"
         "                                           [TCE_SOCKET_GROUP, empty: the server's own]\n"
         "  --root-is-admin B      root may read, replace and remove every user's jobs\n"
         "                                                                   [TCE_ROOT_IS_ADMIN, true]\n"
         "  --session-idle-timeout-s N  close a session with no request, lease or pending save\n"
         "                         for N seconds (0: never)     [TCE_SESSION_IDLE_TIMEOUT_S, 3600]\n"
         "  --max-waits N          concurrent blocked Wait calls; more are refused\n"
         "                         (RESOURCE_EXHAUSTED)                      [TCE_MAX_WAITS, 256]\n"
         "  --max-leases-per-session N  loads one session may hold at once\n"
         "                                                [TCE_MAX_LEASES_PER_SESSION, 4096]\n"
         "  --storage-roots LIST   dirs files are persisted under; only paths under them are\n"
         "                         accepted (empty: memory only)             [TCE_STORAGE_ROOTS, empty]\n"
         "  --persist-threads N    persistence workers                       [TCE_PERSIST_THREADS, 2]\n"
         "  --persist-retries N    retries of a failed write                 [TCE_PERSIST_RETRIES, 5]\n"
         "  --persist-backoff-ms N first retry delay, doubled each time      [TCE_PERSIST_BACKOFF_MS, 200]\n"
         "  --persist-failed-retry-ms N\n"
         "                         persist a file that failed for a reason   [TCE_PERSIST_FAILED_RETRY_MS, 30000]\n"
         "                         that may clear (disk full, I/O) again\n"
         "                         this often (0: never)\n"
         "  --storage-check-timeout-ms N\n"
         "                         a load waits this long for storage to say [TCE_STORAGE_CHECK_TIMEOUT_MS, 2000]\n"
         "                         whether its file changed there, then\n"
         "                         serves the cache (0: no limit)\n"
         "  --keep-last N          per job, evict persisted files of tags older than the\n"
         "                         newest N (0: keep while there is room)    [TCE_KEEP_LAST, 0]\n"
         "  --state-dir DIR        the server's own files (metadata)         [TCE_STATE_DIR, /var/lib/tce]\n"
         "  --metadata-url URL     sqlite:///path/tce.db, or none           [TCE_METADATA_URL,\n"
         "                                                     sqlite://<state_dir>/tce.db]\n"
         "  --server-id ID         this server's rows in a shared MySQL      [TCE_SERVER_ID,\n"
         "                                                     <hostname>:<socket>]\n"
         "  --persist-direct-io B  write with O_DIRECT where supported       [TCE_PERSIST_DIRECT_IO, true]\n"
         "  --persist-io-depth N   O_DIRECT writes in flight per file, 1-64  [TCE_PERSIST_IO_DEPTH, 4]\n"
         "  --drain-timeout-ms N   on SIGTERM, keep persisting at most N ms  [TCE_DRAIN_TIMEOUT_MS, 25000]\n"
         "  --cache-full-timeout-ms N  how long a save into a full cache waits for persistence\n"
         "                         to free room                              [TCE_CACHE_FULL_TIMEOUT_MS, 30000]\n"
         "  --peer-listen H:P      join rings: listen for peer servers here (empty: no ring)\n"
         "                                                                   [TCE_PEER_LISTEN, empty]\n"
         "  --peer-advertise H:P   the endpoint peers use                    [TCE_PEER_ADVERTISE, peer-listen]\n"
         "  --peer-token T         the cluster token peers prove             [TCE_PEER_TOKEN, empty]\n"
         "  --peer-token-file F    read the token from F                     [TCE_PEER_TOKEN_FILE, empty]\n"
         "  --ring-transport T     tcp, or ofi (libfabric RMA)               [TCE_RING_TRANSPORT, tcp]\n"
         "  --ring-streams N       tcp: connections per ring link, 1-16      [TCE_RING_STREAMS, 4]\n"
         "  --ofi-provider P       ofi: the libfabric provider (verbs, efa,  [TCE_OFI_PROVIDER, empty:\n"
         "                         tcp...); devices: TCE_RDMA_DEVICES, else   the first with RMA]\n"
         "                         NCCL_IB_HCA\n"
         "  --backup-share PCT     % of the budget for predecessors' backups [TCE_BACKUP_SHARE, 50]\n"
         "  --backup-threads N     backup workers                            [TCE_BACKUP_THREADS, 1]\n"
         "  --peer-timeout-ms N    give up on a silent peer after N ms       [TCE_PEER_TIMEOUT_MS, 30000]\n"
         "  --peer-handshake-timeout-ms N\n"
         "                         a peer authenticates within N ms          [TCE_PEER_HANDSHAKE_TIMEOUT_MS, 5000]\n"
         "  --peer-max-connections N  authenticated peer links               [TCE_PEER_MAX_CONNECTIONS, 256]\n"
         "  --peer-max-handshakes N   connections authenticating at once     [TCE_PEER_MAX_HANDSHAKES, 64]\n"
         "  --peer-max-handshakes-per-source N\n"
         "                         of those, from one address                [TCE_PEER_MAX_HANDSHAKES_PER_SOURCE, 8]\n"
         "  --ring-fault F         tests only: corrupt = flip a byte of every transfer sent\n"
         "                                                                   [TCE_RING_FAULT, empty]\n"
         "  --config FILE          flat TOML config file                     [TCE_CONFIG]\n"
         "  --print-config         print the effective configuration and exit\n"
         "  --fabric-info          print the fabric devices and providers (JSON) and exit\n"
         "  --version, --help\n";
}

}  // namespace tce
