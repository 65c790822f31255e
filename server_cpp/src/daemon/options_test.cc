#include "daemon/options.h"

#include <gtest/gtest.h>

#include <random>

#include "common/testing.h"
#include "daemon/settings.h"
#include <stdlib.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

namespace tce {
namespace {

Status Parse(const std::vector<std::string>& args, const std::map<std::string, std::string>& env,
             Options* o) {
  Action a;
  return ParseOptions(args, env, o, &a);
}

std::string WriteConfig(const std::string& text) {
  std::string path = MakeTempDir("tce-config") + "/tce.toml";
  std::ofstream(path) << text;
  return path;
}

TEST(Options, Defaults) {
  Options o;
  ASSERT_TRUE(Parse({}, {}, &o).ok());
  EXPECT_EQ(o.socket, "/run/tce/tce.sock");
  EXPECT_EQ(o.memory_budget, "auto");
  EXPECT_EQ(o.log_level, "info");
  EXPECT_EQ(o.rpc_threads, 4);
  EXPECT_EQ(o.max_sessions, 1024);
  EXPECT_EQ(o.socket_group, "");
  EXPECT_TRUE(o.root_is_admin);
  EXPECT_EQ(o.session_idle_timeout_s, 3600);
  EXPECT_EQ(o.max_waits, 256);
  EXPECT_EQ(o.max_leases_per_session, 4096);
}

TEST(Options, LocalUserSettingsAreValidatedAndPrinted) {
  Options o;
  ASSERT_TRUE(Parse({"--socket-group", "tce", "--root-is-admin", "false", "--session-idle-timeout-s", "0",
                     "--max-waits", "8", "--max-leases-per-session", "16"},
                    {}, &o).ok());
  EXPECT_EQ(o.socket_group, "tce");
  EXPECT_FALSE(o.root_is_admin);
  EXPECT_EQ(o.session_idle_timeout_s, 0);
  EXPECT_EQ(o.max_waits, 8);
  EXPECT_EQ(o.max_leases_per_session, 16);
  const std::string text = FormatConfig(o);
  for (const char* line : {"socket_group = \"tce\"", "root_is_admin = false", "session_idle_timeout_s = 0",
                           "max_waits = 8", "max_leases_per_session = 16"})
    EXPECT_NE(text.find(line), std::string::npos) << line;
  EXPECT_EQ(Parse({"--max-waits", "0"}, {}, &o).message(),
            "bad value for max_waits: '0' (an integer from 1 to 65536)");
  EXPECT_EQ(Parse({"--root-is-admin", "yes"}, {}, &o).message(),
            "bad value for root_is_admin: 'yes' (true or false)");
  EXPECT_EQ(Parse({"--socket-group", "a b"}, {}, &o).message(),
            "bad value for socket_group: 'a b' (a group name or gid)");
}

TEST(Options, FileThenEnvironmentThenFlags) {
  std::string cfg = WriteConfig(
      "# comment\nsocket = \"/tmp/file.sock\"  # trailing comment\n"
      "memory_budget = \"2GiB\"\nlog_level = \"debug\"\nrpc_threads = 7\n");
  Options o;
  ASSERT_TRUE(Parse({"--config", cfg}, {}, &o).ok());
  EXPECT_EQ(o.socket, "/tmp/file.sock");
  EXPECT_EQ(o.memory_budget, "2GiB");
  EXPECT_EQ(o.rpc_threads, 7);
  ASSERT_TRUE(Parse({"--config=" + cfg}, {{"TCE_MEMORY_BUDGET", "3GiB"}, {"TCE_RPC_THREADS", "2"}}, &o).ok());
  EXPECT_EQ(o.memory_budget, "3GiB");
  EXPECT_EQ(o.rpc_threads, 2);
  EXPECT_EQ(o.log_level, "debug");
  ASSERT_TRUE(Parse({"--memory-budget", "4GiB"}, {{"TCE_CONFIG", cfg}, {"TCE_MEMORY_BUDGET", "3GiB"}}, &o).ok());
  EXPECT_EQ(o.memory_budget, "4GiB");
  EXPECT_EQ(o.socket, "/tmp/file.sock");
  std::filesystem::remove_all(std::filesystem::path(cfg).parent_path());
}

TEST(Options, ErrorsNameTheSetting) {
  Options o;
  std::string cfg = WriteConfig("socket = \"/tmp/x.sock\"\nbudget = 5\n");
  Status s = Parse({"--config", cfg}, {}, &o);
  EXPECT_EQ(s.code(), Status::Code::kInvalidArgument);
  EXPECT_NE(s.message().find("line 2: unknown key 'budget'"), std::string::npos) << s.message();
  std::filesystem::remove_all(std::filesystem::path(cfg).parent_path());
  s = Parse({"--memory-budget", "lots"}, {}, &o);
  EXPECT_NE(s.message().find("memory_budget: 'lots'"), std::string::npos) << s.message();
  s = Parse({}, {{"TCE_LOG_LEVEL", "loud"}}, &o);
  EXPECT_NE(s.message().find("TCE_LOG_LEVEL"), std::string::npos) << s.message();
  EXPECT_FALSE(Parse({"--socket", "relative.sock"}, {}, &o).ok());
  EXPECT_FALSE(Parse({"--rpc-threads", "0"}, {}, &o).ok());
  EXPECT_FALSE(Parse({"--bogus"}, {}, &o).ok());
  EXPECT_FALSE(Parse({"--persist-direct-io", "maybe"}, {}, &o).ok());
  ASSERT_TRUE(Parse({}, {{"TCE_PERSIST_DIRECT_IO", "false"}}, &o).ok());
  EXPECT_FALSE(o.persist_direct_io);
  EXPECT_FALSE(Parse({"--socket"}, {}, &o).ok());
  EXPECT_FALSE(Parse({"--config", "/nonexistent/tce.toml"}, {}, &o).ok());
}

TEST(Options, OperationsEndpointsAndLogFormat) {
  Options o;
  ASSERT_TRUE(Parse({}, {}, &o).ok());
  EXPECT_EQ(o.log_format, "text");
  EXPECT_EQ(o.metrics_listen, "");
  EXPECT_EQ(o.health_listen, "");
  ASSERT_TRUE(Parse({"--metrics-listen", "0.0.0.0:9464", "--log-format", "json"},
                    {{"TCE_HEALTH_LISTEN", "127.0.0.1:7071"}}, &o).ok());
  EXPECT_EQ(o.metrics_listen, "0.0.0.0:9464");
  EXPECT_EQ(o.health_listen, "127.0.0.1:7071");
  EXPECT_EQ(o.log_format, "json");
  Status s = Parse({"--log-format", "xml"}, {}, &o);
  EXPECT_NE(s.message().find("log_format: 'xml' (text or json)"), std::string::npos) << s.message();
  s = Parse({"--metrics-listen", "9464"}, {}, &o);
  EXPECT_NE(s.message().find("metrics_listen: '9464' (host:port)"), std::string::npos) << s.message();
  EXPECT_FALSE(Parse({"--health-listen", "host:99999"}, {}, &o).ok());
}

TEST(Options, PrintedConfigHidesSecrets) {
  Options o;
  ASSERT_TRUE(Parse({}, {{"TCE_METADATA_URL", "mysql://tce:s3cret@db:3306/tce"},
                         {"TCE_PEER_TOKEN", "tok3n"}}, &o).ok());
  const std::string text = FormatConfig(o);
  EXPECT_NE(text.find("metadata_url = \"mysql://tce:***@db:3306/tce\""), std::string::npos) << text;
  EXPECT_NE(text.find("peer_token = \"***\""), std::string::npos) << text;
  EXPECT_EQ(text.find("s3cret"), std::string::npos) << text;
  EXPECT_EQ(text.find("tok3n"), std::string::npos) << text;
}

TEST(Options, PrintedConfigReadsBack) {
  Options o;
  ASSERT_TRUE(Parse({"--socket", "/tmp/a b\"c.sock", "--allowed-uids", "1000,1001"}, {}, &o).ok());
  std::string cfg = WriteConfig(FormatConfig(o));
  Options back;
  ASSERT_TRUE(Parse({"--config", cfg}, {}, &back).ok());
  EXPECT_EQ(back.socket, o.socket);
  EXPECT_EQ(back.allowed_uids, "1000,1001");
  std::filesystem::remove_all(std::filesystem::path(cfg).parent_path());
}

TEST(Options, ServerIdDefaultsToHostAndSocket) {
  Options o;
  ASSERT_TRUE(Parse({"--socket", "/run/x/tce.sock"}, {}, &o).ok());
  char host[256] = {};
  ASSERT_EQ(gethostname(host, sizeof(host) - 1), 0);
  EXPECT_EQ(EffectiveServerId(o), std::string(host) + ":/run/x/tce.sock");
  ASSERT_TRUE(Parse({}, {{"TCE_SERVER_ID", "node-7"}}, &o).ok());
  EXPECT_EQ(EffectiveServerId(o), "node-7");
  Status s = Parse({"--server-id", "a\nb"}, {}, &o);
  EXPECT_EQ(s.code(), Status::Code::kInvalidArgument);
  EXPECT_NE(s.message().find("server_id"), std::string::npos) << s.message();
}

TEST(Options, Budget) {
  MemoryLimits limited{8ull << 30, 64ull << 30}, unlimited{0, 64ull << 30};
  uint64_t b;
  ASSERT_TRUE(ResolveBudget("auto", limited, &b).ok());
  EXPECT_EQ(b, (8ull << 30) / 10 * 9);
  ASSERT_TRUE(ResolveBudget("auto", unlimited, &b).ok());
  EXPECT_EQ(b, 32ull << 30);
  ASSERT_TRUE(ResolveBudget("25%", limited, &b).ok());
  EXPECT_EQ(b, 2ull << 30);
  ASSERT_TRUE(ResolveBudget("1GiB", limited, &b).ok());
  EXPECT_EQ(b, 1ull << 30);
  EXPECT_FALSE(ResolveBudget("0", limited, &b).ok());
  EXPECT_FALSE(ResolveBudget("150%", limited, &b).ok());
}

TEST(Options, Uids) {
  std::set<uid_t> u;
  ASSERT_TRUE(ParseUids("", 1234, &u).ok());
  EXPECT_EQ(u, (std::set<uid_t>{0, 1234}));
  ASSERT_TRUE(ParseUids("5, 6", 1234, &u).ok());
  EXPECT_EQ(u, (std::set<uid_t>{5, 6}));
  EXPECT_FALSE(ParseUids("5,x", 1234, &u).ok());
}

}  // namespace
}  // namespace tce

namespace tce {
namespace {

// A bounded random-input loop over the option decoders (config files,
// flags, environment): every input ends in a Status, never a crash.
TEST(OptionsFuzz, RandomConfigTextFlagsAndValuesEndInAStatus) {
  std::mt19937_64 rng(4);
  const char* keys[] = {"socket", "memory_budget", "allowed_uids", "max_sessions", "storage_roots",
                        "metadata_url", "peer_listen", "peer_timeout_ms", "ring_streams",
                        "peer_max_handshakes", "log_level", "persist_io_depth", "keep_last"};
  const std::string alphabet = "abc019 =\"#\\\n\t-_/:%,.GiBMK\x01\xff";
  auto text = [&](size_t max) {
    std::string s(rng() % (max + 1), ' ');
    for (char& c : s) c = alphabet[rng() % alphabet.size()];
    return s;
  };
  for (int it = 0; it < 20000; ++it) {
    std::vector<std::pair<std::string, std::string>> pairs;
    Status parsed = ParseConfigText(text(200), "fuzz.toml", &pairs);
    (void)parsed;
    Options o;
    const std::string key = keys[rng() % (sizeof(keys) / sizeof(keys[0]))];
    Status set = SetOption(&o, key, text(24));
    (void)set;
    Options out;
    Action action;
    Status flags = ParseOptions({"tce-server", "--" + text(12), text(12)}, {{"TCE_" + text(8), text(8)}}, &out, &action);
    (void)flags;
  }
}

TEST(Options, PreallocAutoStaysWithinTheBudgetMemoryCgroupAndHugePages) {
  const uint64_t GiB = uint64_t{1} << 30;
  MemoryLimits l;
  l.mem_total = 64 * GiB;
  l.mem_available = 60 * GiB;
  uint64_t p = 0;
  std::string why;
  ASSERT_TRUE(ResolvePrealloc("auto", 16 * GiB, l, false, &p, &why).ok());
  EXPECT_EQ(p, 8 * GiB);
  EXPECT_EQ(why, "half the budget");
  l.cgroup_limit = 10 * GiB;  // 9 GiB usable: at most half of it
  ASSERT_TRUE(ResolvePrealloc("auto", 16 * GiB, l, false, &p, &why).ok());
  EXPECT_EQ(p, l.cgroup_limit / 10 * 9 / 2);
  l.mem_available = 2 * GiB;
  ASSERT_TRUE(ResolvePrealloc("auto", 16 * GiB, l, false, &p, &why).ok());
  EXPECT_EQ(p, 1 * GiB);
  // Huge pages are not charged to the memory cgroup: the free pages bound them.
  l.mem_available = 60 * GiB;
  l.hugepages_free = 1024;  // 2 GiB
  ASSERT_TRUE(ResolvePrealloc("auto", 16 * GiB, l, true, &p, &why).ok());
  EXPECT_EQ(p, 2 * GiB);
  EXPECT_EQ(why, "the free huge pages");
  ASSERT_TRUE(ResolvePrealloc("0", 16 * GiB, l, false, &p, &why).ok());
  EXPECT_EQ(p, 0u);
}

TEST(Options, APreallocSizeTheServerCannotHonourIsRefused) {
  const uint64_t GiB = uint64_t{1} << 30;
  MemoryLimits l;
  l.cgroup_limit = 4 * GiB;
  l.hugepages_free = 512;  // 1 GiB
  uint64_t p = 0;
  std::string why;
  Status s = ResolvePrealloc("2GiB", 1 * GiB, l, false, &p, &why);
  EXPECT_NE(s.message().find("exceeds the memory budget"), std::string::npos) << s.message();
  s = ResolvePrealloc("3900MiB", 8 * GiB, l, false, &p, &why);
  EXPECT_NE(s.message().find("cgroup"), std::string::npos) << s.message();
  s = ResolvePrealloc("2GiB", 8 * GiB, l, true, &p, &why);
  EXPECT_NE(s.message().find("free huge pages"), std::string::npos) << s.message();
  EXPECT_TRUE(ResolvePrealloc("512MiB", 8 * GiB, l, true, &p, &why).ok());
  EXPECT_EQ(p, GiB / 2);
  EXPECT_FALSE(ResolvePrealloc("lots", 8 * GiB, l, false, &p, &why).ok());
}

}  // namespace
}  // namespace tce
