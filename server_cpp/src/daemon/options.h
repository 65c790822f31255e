// Options: the daemon's settings. Precedence: defaults < config file (flat
// TOML: `key = value`, # comments) < TCE_* environment < command-line flags.
// Plain data plus pure functions; any thread.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "cache/memory_limits.h"
#include "common/status.h"

namespace tce {

struct Options {
  std::string socket = "/run/tce/tce.sock";
  std::string memory_budget = "auto";
  std::string log_level = "info";
  std::string log_format = "text";  // text | json
  std::string metrics_listen;  // host:port of the Prometheus endpoint; empty: none
  std::string health_listen;   // host:port of the gRPC health service; empty: none
  std::string allowed_uids;  // empty: the server's own uid and root
  int rpc_threads = 4;
  int max_sessions = 1024;
  int max_control_connections = 1024;  // control-socket connections open at once
  std::string socket_group;          // group of the sockets (0660); empty: the server's own
  bool root_is_admin = true;         // uid 0 may read, replace and remove every user's jobs
  int session_idle_timeout_s = 3600;  // close a session idle this long (0: never)
  int max_waits = 256;               // concurrent blocked Wait calls
  int max_leases_per_session = 4096;
  std::string storage_roots;  // comma-separated absolute dirs; empty: memory only
  int persist_threads = 2;
  int persist_retries = 5;
  int persist_backoff_ms = 200;
  int cache_full_timeout_ms = 30000;
  bool persist_direct_io = true;
  int persist_io_depth = 4;            // O_DIRECT writes in flight per file
  int drain_timeout_ms = 25000;        // SIGTERM: how long to finish persisting and backing up
  int keep_last = 0;
  std::string state_dir = "/var/lib/tce";
  std::string metadata_url;  // empty: sqlite://<state_dir>/tce.db; "none": no metadata
  std::string server_id;     // this server's rows in a shared store; empty: <hostname>:<socket>
  // The ring (peer_listen empty: this server takes part in none).
  std::string peer_listen;     // host:port for server-to-server connections
  std::string peer_advertise;  // the endpoint peers should use; empty: peer_listen
  std::string peer_token;      // the cluster token (a secret; never printed)
  std::string peer_token_file; // read the token from this file instead
  std::string ring_transport = "tcp";  // tcp | ofi
  int ring_streams = 4;                // tcp: connections per ring link, chunks striped over them
  std::string ofi_provider;    // ofi: libfabric provider name; empty: the first with RMA
  int backup_share = 50;       // percent of memory_budget for predecessors' backups
  int backup_threads = 1;
  int peer_timeout_ms = 30000;
  // A load waits this long for storage to say whether the file changed
  // there, then serves the cache (0: no limit).
  int storage_check_timeout_ms = 2000;
  int persist_failed_retry_ms = 30000;  // a file FAILED for a reason that may clear is persisted again this often (0: never)
  int peer_handshake_timeout_ms = 5000;  // a connection authenticates within this, or is dropped
  int peer_max_connections = 256;        // authenticated peer links (lanes included)
  int peer_max_handshakes = 64;          // connections still authenticating, at once
  int peer_max_handshakes_per_source = 8;  // of those, from one remote address
  std::string ring_fault;  // tests only: "corrupt" flips a byte of every transfer sent
  std::string config;  // the config file read, if any (--config or TCE_CONFIG)
};

enum class Action { kRun, kPrintConfig, kHelp, kVersion, kFabricInfo };

// `env` maps variable names to values (main passes the real environment).
Status ParseOptions(const std::vector<std::string>& args,
                    const std::map<std::string, std::string>& env, Options* out, Action* action);

// Validates one setting and stores it; `key` is the config-file name.
Status SetOption(Options* o, const std::string& key, const std::string& value);

// Parses flat TOML text into key/value pairs (strings unquoted).
Status ParseConfigText(const std::string& text, const std::string& name,
                       std::vector<std::pair<std::string, std::string>>* out);

// "auto", "NN%", or a size -> bytes.
Status ResolveBudget(const std::string& text, const MemoryLimits& limits, uint64_t* out);
// The metadata URL in effect ("" for none).
std::string EffectiveMetadataUrl(const Options& o);
// server_id, or "<hostname>:<socket>" when it is empty.
std::string EffectiveServerId(const Options& o);
// "/a, /b" -> {"/a", "/b"}; each must be absolute.
Status ParseRoots(const std::string& text, std::vector<std::string>* out);
// "" -> {self, 0}; "1000,1001" -> {1000, 1001}.
Status ParseUids(const std::string& text, uid_t self, std::set<uid_t>* out);

std::string FormatConfig(const Options& o);
std::string HelpText();

}  // namespace tce
