// The table of the server's settings: one entry per Options field says its
// name, how a value is checked and stored, how it prints and what --help
// says. Config-file, environment and flag parsing, --print-config and --help
// all come from this table, so a new setting is one Options field plus one
// entry in settings.cc. Names follow one rule: key `foo_bar`, environment
// TCE_FOO_BAR, flag --foo-bar. Immutable after static initialisation; any
// thread.
#pragma once

#include <string>
#include <utility>
#include <variant>
#include <vector>

#include "common/status.h"
#include "daemon/options.h"

namespace tce {

struct Setting {
  // Inclusive bounds of an integer setting, and what a refusal asks for
  // (empty: "an integer from <lo> to <hi>").
  struct Range {
    Range() = default;
    Range(long low, long high, std::string refusal = "")
        : lo(low), hi(high), want(std::move(refusal)) {}
    long lo = 0, hi = 0;
    std::string want;
  };
  // Why `value` is refused ("" when it is accepted).
  using Check = std::string (*)(const std::string& value);
  // What --print-config shows for a value (a secret as "***").
  using Show = std::string (*)(const std::string& value);

  const char* key = "";  // the config-file name
  const char* arg = "";  // the flag's argument in --help: PATH, N, B...
  std::variant<std::string Options::*, int Options::*, bool Options::*> field;
  Range range;            // int fields
  Check check = nullptr;  // string fields; nullptr: any value
  Show show = nullptr;    // string fields; nullptr: as it is
  const char* help = "";  // a sentence or two; --help wraps it
  // --help's default where the value alone does not tell (what empty
  // means); nullptr: the field's default value.
  const char* default_text = nullptr;

  std::string Env() const;   // TCE_FOO_BAR
  std::string Flag() const;  // --foo-bar
  Setting DefaultText(const char* text) const {
    Setting s = *this;
    s.default_text = text;
    return s;
  }
  Setting Shown(Show how) const {
    Setting s = *this;
    s.show = how;
    return s;
  }
};

// Every setting, in the order --help and --print-config list them.
const std::vector<Setting>& Settings();

// The setting named `key` (config-file name), or nullptr.
const Setting* FindSetting(const std::string& key);

// Validates one setting and stores it; `key` is the config-file name.
Status SetOption(Options* o, const std::string& key, const std::string& value);

// The effective configuration as flat TOML that --config reads back, secrets
// replaced by "***".
std::string FormatConfig(const Options& o);

// --help: every setting with its flag, meaning, environment variable and
// default.
std::string HelpText();

}  // namespace tce
