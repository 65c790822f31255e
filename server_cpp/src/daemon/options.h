// Options: the daemon's settings, and how they are read. Precedence:
// defaults < config file (flat TOML: `key = value`, # comments) < TCE_*
// environment < command-line flags. Plain data plus pure functions; any
// thread.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "cache/memory_limits.h"
#include "cache/read_grants.h"
#include "common/status.h"
#include "storage/backends.h"

namespace tce {

// The daemon's settings. Each field is one entry of the settings table
// (daemon/settings.cc), which names, checks, prints and documents it; the
// initialiser here is its default.
struct Options {
  // Sockets, logging and the operations endpoints.
  std::string socket = "/run/tce/tce.sock";
  std::string memory_budget = "auto";
  std::string memory_backing = "auto";
  std::string prealloc = "0";
  std::string log_level = "info";
  std::string log_format = "text";
  std::string metrics_listen;
  std::string health_listen;
  // Local users and their limits.
  std::string allowed_uids;
  int rpc_threads = 4;
  int max_sessions = 1024;
  int max_sessions_per_uid = 256;
  int max_control_connections = 1024;
  int max_control_connections_per_uid = 256;
  std::string socket_group;
  bool root_is_admin = true;
  int session_idle_timeout_s = 3600;
  int max_waits = 256;
  int max_peer_calls = 64;
  int max_peer_calls_per_uid = 32;
  int max_leases_per_session = 4096;
  int max_waits_per_uid = 64;
  // What one client can make the server remember (cache/metadata_quota.h).
  std::string metadata_budget = "auto";
  int metadata_share_per_uid = 25;
  int max_jobs_per_uid = 4096;
  int max_tags_per_job = 1024;
  int max_grants_per_job = 256;
  int max_version_leases_per_uid = 4096;
  std::string read_grants;
  int version_lease_s = 300;
  int version_lease_max_s = 3600;
  int max_follows = 64;
  int max_follows_per_uid = 8;
  int max_range_buffers_per_uid = 4;
  // Persistence.
  std::string storage_roots;
  int persist_threads = 2;
  int persist_retries = 5;
  int persist_backoff_ms = 200;
  int storage_check_timeout_ms = 2000;
  int persist_failed_retry_ms = 30000;
  int storage_keep_last = 0;
  // Object storage (storage_roots entries DIR=s3://BUCKET[/PREFIX]).
  std::string s3_endpoint;
  std::string s3_region = "us-east-1";
  bool s3_path_style = false;
  bool s3_verify_tls = true;
  std::string s3_ca_file;
  std::string s3_credentials_file;
  std::string s3_profile = "default";
  std::string s3_part_size = "8MiB";
  std::string s3_range_size = "32MiB";
  int s3_parallel = 10;
  int s3_retries = 8;
  int s3_backoff_ms = 100;
  int s3_request_timeout_ms = 120000;
  std::string s3_checksum = "crc32";
  // Metadata.
  std::string state_dir = "/var/lib/tce";
  std::string metadata_url;
  std::string server_id;
  // Eviction, writes and shutdown.
  int keep_last = 0;
  bool persist_direct_io = true;
  int persist_io_depth = 4;
  int drain_timeout_ms = 25000;
  int cache_full_timeout_ms = 30000;
  // The ring (peer_listen empty: this server takes part in none).
  std::string peer_listen;
  std::string peer_advertise;
  std::string peer_token;
  std::string peer_token_file;
  std::string peer_cert_file;  // this node's certificate (PEM); with peer_key_file and peer_ca_file
  std::string peer_key_file;
  std::string peer_ca_file;
  std::string ring_transport = "tcp";
  int ring_streams = 4;
  std::string ofi_provider;
  int backup_share = 50;
  int backup_threads = 1;
  bool cooperative_restore = true;  // a file in no node's memory is read from storage once per ring
  bool restore_prefetch = true;  // a restart on empty nodes reads the newest tag before the ranks ask
  int peer_timeout_ms = 30000;
  int peer_handshake_timeout_ms = 5000;
  int peer_max_connections = 256;
  int peer_max_handshakes = 64;
  int peer_max_handshakes_per_source = 8;
  int ring_restore_wait_ms = 120000;

  std::string config;  // the config file read, if any (--config or TCE_CONFIG); not a setting
};

enum class Action { kRun, kPrintConfig, kHelp, kVersion, kFabricInfo };

// Reads the config file, the TCE_* variables of `env` (main passes the real
// environment) and `args` into `out`, in that order of precedence; `action`
// says what main should do.
Status ParseOptions(const std::vector<std::string>& args,
                    const std::map<std::string, std::string>& env, Options* out, Action* action);

// Parses flat TOML text into key/value pairs (strings unquoted); a key that
// names no setting is an error.
Status ParseConfigText(const std::string& text, const std::string& name,
                       std::vector<std::pair<std::string, std::string>>* out);

// "auto", "NN%", or a size -> bytes.
Status ResolveBudget(const std::string& text, const MemoryLimits& limits, uint64_t* out);

// "0", "auto" or a size -> the bytes to pre-fault at start (cache/buffer_pool.h).
// auto: half the budget, at most half the memory available now and half of
// 90% of the cgroup limit (4 KiB pages and thp) or the free huge pages
// (hugetlb, which the memory cgroup does not charge). A size must fit in the
// budget and in 90% of the cgroup limit, or the free huge pages. `why` says
// how auto was bounded.
Status ResolvePrealloc(const std::string& text, uint64_t budget, const MemoryLimits& limits,
                       bool hugetlb, uint64_t* out, std::string* why);

// "auto" or a size -> metadata_budget's bytes. auto: a quarter of the
// memory the server has beside `memory_budget` (the cgroup limit, else RAM,
// less the budget), from 16 MiB to 1 GiB. `why` says how auto was reached.
Status ResolveMetadataBudget(const std::string& text, uint64_t memory_budget, const MemoryLimits& limits,
                             uint64_t* out, std::string* why);

// The metadata URL in effect ("" for none).
std::string EffectiveMetadataUrl(const Options& o);

// server_id, or "<hostname>:<socket>" when it is empty.
std::string EffectiveServerId(const Options& o);

// This server's temp-file prefix, from its identity (server_id: the host and
// socket by default), so servers sharing a directory (a shared filesystem)
// never take each other's temp files for their own.
std::string TempPrefix(const std::string& id);

// Every storage backend's options: how directory roots write (the
// persist_* settings, this server's temp prefix) and the s3_* settings
// (unfinished uploads journaled under state_dir).
StorageOptions StorageSettings(const Options& o);

// "" -> {self, 0}; "1000,1001" -> {1000, 1001}.
Status ParseUids(const std::string& text, uid_t self, std::set<uid_t>* out);

// "uid:1001, gid:2000" -> those uids and gids ("" -> none).
Status ParseReadGrants(const std::string& text, ReadGrants::Ids* out);

}  // namespace tce
