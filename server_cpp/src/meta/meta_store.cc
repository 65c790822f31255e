// The one place metadata backends are chosen: a URL scheme to a store. A
// backend built only with an optional library is behind its CMake option,
// and this file is the only one that asks.
#include "meta/meta_store.h"

#include "meta/sqlite_store.h"
#if TCE_WITH_MYSQL
#include "meta/mysql_store.h"
#endif

namespace tce {
namespace {

bool HasScheme(const std::string& url, const char* scheme) {
  return url.compare(0, std::char_traits<char>::length(scheme), scheme) == 0;
}

}  // namespace

std::vector<std::string> MetaStoreSchemes() {
#if TCE_WITH_MYSQL
  return {"sqlite", "mysql"};
#else
  return {"sqlite"};
#endif
}

Status OpenMetaStore(const std::string& url, std::unique_ptr<MetaStore>* out, const std::string& server_id) {
  if (HasScheme(url, "sqlite://")) {
    const std::string path = url.substr(9);
    if (path.empty() || path[0] != '/')
      return Status::InvalidArgument("sqlite URL needs an absolute path (sqlite:///dir/tce.db): " + url);
    return OpenSqliteStore(path, out);
  }
  if (HasScheme(url, "mysql://")) {
#if TCE_WITH_MYSQL
    return OpenMysqlStore(url, server_id, out);
#else
    (void)server_id;
    return Status::NotSupported("this tce-server was built without MySQL support (cmake -DTCE_WITH_MYSQL=ON "
                                "needs MariaDB's Connector/C, libmariadb-dev): " + RedactUrl(url));
#endif
  }
  return Status::NotSupported("metadata URL scheme not supported: " + url +
                              " (sqlite:///path or mysql://user:pass@host:port/db)");
}

std::string RedactUrl(const std::string& url) {
  size_t scheme = url.find("://");
  if (scheme == std::string::npos) return url;
  size_t at = url.rfind('@');
  size_t colon = url.find(':', scheme + 3);
  if (at == std::string::npos || colon == std::string::npos || colon > at) return url;
  return url.substr(0, colon + 1) + "***" + url.substr(at);
}

}  // namespace tce
