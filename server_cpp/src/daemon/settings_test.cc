#include "daemon/settings.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <set>

#include "common/testing.h"

namespace tce {
namespace {

Status Parse(const std::vector<std::string>& args, const std::map<std::string, std::string>& env,
             Options* o) {
  Action a;
  return ParseOptions(args, env, o, &a);
}

// The value of `s` in `o` as a flag or variable takes it.
std::string Raw(const Setting& s, const Options& o) {
  if (auto f = std::get_if<int Options::*>(&s.field)) return std::to_string(o.**f);
  if (auto f = std::get_if<bool Options::*>(&s.field)) return o.**f ? "true" : "false";
  return o.*std::get<std::string Options::*>(s.field);
}

TEST(Settings, NamesFollowOneRuleAndAreUnique) {
  std::set<std::string> keys;
  for (const Setting& s : Settings()) {
    EXPECT_TRUE(keys.insert(s.key).second) << s.key;
    EXPECT_EQ(FindSetting(s.key), &s);
  }
  EXPECT_EQ(FindSetting("budget"), nullptr);
  const Setting* s = FindSetting("peer_max_handshakes_per_source");
  ASSERT_NE(s, nullptr);
  EXPECT_EQ(s->Env(), "TCE_PEER_MAX_HANDSHAKES_PER_SOURCE");
  EXPECT_EQ(s->Flag(), "--peer-max-handshakes-per-source");
}

TEST(Settings, HelpListsEverySetting) {
  const std::string help = HelpText();
  for (const Setting& s : Settings()) {
    const std::string entry = "\n  " + s.Flag() + " " + s.arg;
    const size_t at = help.find(entry);
    ASSERT_NE(at, std::string::npos) << s.key;
    EXPECT_TRUE(help[at + entry.size()] == ' ' || help[at + entry.size()] == '\n') << s.key;
    EXPECT_NE(help.find("[" + s.Env() + ", "), std::string::npos) << s.key;
  }
  for (const char* flag : {"--persist-io-depth N", "--drain-timeout-ms N", "--ring-streams N"})
    EXPECT_NE(help.find(flag), std::string::npos) << flag;
  EXPECT_NE(help.find("[TCE_SOCKET, /run/tce/tce.sock]"), std::string::npos) << help;
  EXPECT_NE(help.find("[TCE_ROOT_IS_ADMIN, true]"), std::string::npos) << help;
  EXPECT_NE(help.find("[TCE_METADATA_URL, sqlite://<state_dir>/tce.db]"), std::string::npos) << help;
  EXPECT_NE(help.find("[TCE_PEER_TOKEN, empty]"), std::string::npos) << help;
  EXPECT_NE(help.find("--config FILE"), std::string::npos);
  for (size_t start = 0, end; start < help.size(); start = end + 1) {
    end = help.find('\n', start);
    const std::string line = help.substr(start, end - start);
    EXPECT_TRUE(line.empty() || line.back() != ' ') << "trailing space: '" << line << "'";
  }
}

TEST(Settings, PrintConfigPrintsEverySettingOnce) {
  const std::string text = FormatConfig(Options{});
  size_t lines = 0;
  for (char c : text) lines += c == '\n';
  EXPECT_EQ(lines, Settings().size() + 1);  // and the heading
  for (const Setting& s : Settings())
    EXPECT_NE(text.find("\n" + std::string(s.key) + " = "), std::string::npos) << s.key;
  EXPECT_NE(text.find("\nring_streams = 4\n"), std::string::npos) << text;
  EXPECT_NE(text.find("\npersist_direct_io = true\n"), std::string::npos) << text;
  EXPECT_NE(text.find("\nlog_format = \"text\"\n"), std::string::npos) << text;
}

TEST(Settings, DefaultsPassTheirOwnChecksAndReadBack) {
  const std::string path = MakeTempDir("tce-settings") + "/defaults.toml";
  std::ofstream(path) << FormatConfig(Options{});
  Options back;
  ASSERT_TRUE(Parse({"--config", path}, {}, &back).ok());
  EXPECT_EQ(FormatConfig(back), FormatConfig(Options{}));
  std::filesystem::remove_all(std::filesystem::path(path).parent_path());
}

TEST(Settings, EverySettingIsReadFromItsFlagAndItsVariable) {
  const Options defaults;
  for (const Setting& s : Settings()) {
    const std::string value = Raw(s, defaults);
    if (value.empty()) continue;  // an empty variable counts as unset
    Options by_flag, by_env;
    ASSERT_TRUE(Parse({s.Flag(), value}, {}, &by_flag).ok()) << s.key;
    ASSERT_TRUE(Parse({}, {{s.Env(), value}}, &by_env).ok()) << s.key;
    EXPECT_EQ(Raw(s, by_flag), value) << s.key;
    EXPECT_EQ(Raw(s, by_env), value) << s.key;
  }
  Options o;
  ASSERT_TRUE(Parse({"--ring-streams", "9", "--persist-io-depth", "7"}, {{"TCE_DRAIN_TIMEOUT_MS", "5"}}, &o)
                  .ok());
  EXPECT_EQ(o.ring_streams, 9);
  EXPECT_EQ(o.persist_io_depth, 7);
  EXPECT_EQ(o.drain_timeout_ms, 5);
}

TEST(Settings, IntegersOutsideTheirRangeAreRefusedWithIt) {
  for (const Setting& s : Settings()) {
    if (!std::holds_alternative<int Options::*>(s.field)) continue;
    Options o;
    for (long v : {s.range.lo - 1, s.range.hi + 1}) {
      const std::string text = std::to_string(v);
      EXPECT_EQ(SetOption(&o, s.key, text).message(),
                "bad value for " + std::string(s.key) + ": '" + text + "' (" + s.range.want + ")");
    }
    EXPECT_TRUE(SetOption(&o, s.key, std::to_string(s.range.lo)).ok()) << s.key;
    EXPECT_TRUE(SetOption(&o, s.key, std::to_string(s.range.hi)).ok()) << s.key;
  }
  Options o;
  EXPECT_EQ(SetOption(&o, "persist_backoff_ms", "0").message(),
            "bad value for persist_backoff_ms: '0' (milliseconds, 1 to 600000)");
  EXPECT_EQ(SetOption(&o, "keep_last", "-1").message(), "bad value for keep_last: '-1' (an integer >= 0)");
  EXPECT_EQ(SetOption(&o, "nope", "1").message(), "unknown setting 'nope'");
}

}  // namespace
}  // namespace tce
