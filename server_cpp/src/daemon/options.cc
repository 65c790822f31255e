#include "daemon/options.h"

#include <unistd.h>
#include <zlib.h>

#include <cctype>
#include <cstdlib>
#include <fstream>
#include <sstream>

#include "common/strings.h"
#include "daemon/settings.h"

namespace tce {
namespace {

std::string Trim(const std::string& s) {
  size_t b = s.find_first_not_of(" \t\r"), e = s.find_last_not_of(" \t\r");
  return b == std::string::npos ? "" : s.substr(b, e - b + 1);
}

}  // namespace

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
    if (!FindSetting(key)) return Status::InvalidArgument(where() + "unknown key '" + key + "'");
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
    for (const Setting& s : Settings())
      if (name == s.Flag()) setting = &s;
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
  for (const Setting& st : Settings()) {
    auto it = env.find(st.Env());
    if (it == env.end() || it->second.empty()) continue;
    Status s = SetOption(&o, st.key, it->second);
    if (!s.ok()) return Status::InvalidArgument(st.Env() + ": " + s.message());
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

Status ResolveMetadataBudget(const std::string& text, uint64_t memory_budget, const MemoryLimits& limits,
                             uint64_t* out, std::string* why) {
  constexpr uint64_t kMin = uint64_t{16} << 20, kMax = uint64_t{1} << 30;
  if (text != "auto") {
    if (!ParseSize(text, out) || *out == 0) return Status::InvalidArgument("bad size " + text);
    *why = "as set";
    return Status::OK();
  }
  const uint64_t memory = limits.cgroup_limit ? limits.cgroup_limit : limits.mem_total;
  const uint64_t headroom = memory > memory_budget ? memory - memory_budget : 0;
  *out = std::min(kMax, std::max(kMin, headroom / 4));
  *why = std::string("a quarter of the ") + (limits.cgroup_limit ? "cgroup limit" : "memory") +
         " beside memory_budget (" + HumanBytes(headroom) + "), from 16 MiB to 1 GiB";
  return Status::OK();
}

Status ResolvePrealloc(const std::string& text, uint64_t budget, const MemoryLimits& limits,
                       bool hugetlb, uint64_t* out, std::string* why) {
  const uint64_t cgroup_room = limits.cgroup_limit / 10 * 9;
  const uint64_t huge_room = limits.hugepages_free * (uint64_t{2} << 20);
  if (text == "auto") {
    *out = budget / 2;
    *why = "half the budget";
    auto bound = [&](uint64_t v, const char* what) {
      if (v < *out) *out = v, *why = what;
    };
    if (limits.mem_available) bound(limits.mem_available / 2, "half the available memory");
    // Huge pages are not charged to the memory cgroup: their own reservation bounds them.
    if (limits.cgroup_limit && !hugetlb) bound(cgroup_room / 2, "half of 90% of the cgroup limit");
    if (hugetlb) bound(huge_room, "the free huge pages");
    return Status::OK();
  }
  if (!ParseSize(text, out)) return Status::InvalidArgument("bad size " + text + " (a size, 0 or auto)");
  *why = "the size set";
  if (*out > budget)
    return Status::InvalidArgument(text + " exceeds the memory budget of " + HumanBytes(budget));
  if (hugetlb && *out > huge_room)
    return Status::InvalidArgument(text + " exceeds the free huge pages (" + HumanBytes(huge_room) + ")");
  if (limits.cgroup_limit && !hugetlb && *out > cgroup_room)
    return Status::InvalidArgument(text + " exceeds 90% of the cgroup memory limit of " +
                                   HumanBytes(limits.cgroup_limit));
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

std::string TempPrefix(const std::string& id) {
  const uint32_t crc = static_cast<uint32_t>(crc32(0L, reinterpret_cast<const Bytef*>(id.data()),
                                                   static_cast<uInt>(id.size())));
  char hex[9];
  snprintf(hex, sizeof(hex), "%08x", crc);
  return std::string(".tce-") + hex + ".";
}

StorageOptions StorageSettings(const Options& o) {
  StorageOptions all;
  all.file.env = Env::Default();
  all.file.direct_io = o.persist_direct_io;
  all.file.io_depth = o.persist_io_depth;
  all.file.temp_prefix = TempPrefix(EffectiveServerId(o));
  S3StoreOptions& s = all.s3;
  s.endpoint = o.s3_endpoint;
  s.region = o.s3_region;
  s.path_style = o.s3_path_style;
  s.verify_tls = o.s3_verify_tls;
  s.ca_file = o.s3_ca_file;
  s.credentials_file = o.s3_credentials_file;
  s.profile = o.s3_profile;
  if (!ParseSize(o.s3_part_size, &s.part_size)) s.part_size = 8 << 20;  // checked with the settings
  if (!ParseSize(o.s3_range_size, &s.range_size)) s.range_size = 32 << 20;
  s.parallel = o.s3_parallel;
  s.retries = o.s3_retries;
  s.backoff_ms = o.s3_backoff_ms;
  s.request_timeout_ms = o.s3_request_timeout_ms;
  s.checksum = o.s3_checksum;
  s.journal = o.state_dir;  // a directory: each store journals in a file of its own there
  return all;
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

Status ParseReadGrants(const std::string& text, ReadGrants::Ids* out) {
  *out = ReadGrants::Ids{};
  std::stringstream ss(text);
  std::string part;
  while (std::getline(ss, part, ',')) {
    part = Trim(part);
    if (part.empty() && Trim(text).empty()) break;
    const bool uid = part.rfind("uid:", 0) == 0, gid = part.rfind("gid:", 0) == 0;
    const std::string num = (uid || gid) ? part.substr(4) : std::string();
    char* end = nullptr;
    unsigned long v = std::strtoul(num.c_str(), &end, 10);
    if (num.empty() || !std::isdigit(static_cast<unsigned char>(num[0])) || *end || v > 0xFFFFFFFEul)
      return Status::InvalidArgument("bad read grant '" + part + "': want uid:N or gid:N");
    if (uid) out->uids.insert(static_cast<uid_t>(v));
    else out->gids.insert(static_cast<gid_t>(v));
  }
  return Status::OK();
}

}  // namespace tce
