// The MySQL/MariaDB MetaStore (MariaDB Connector/C), created through
// OpenMetaStore (meta/meta_store.cc); built only with TCE_WITH_MYSQL=ON,
// the default.
#pragma once

#include <memory>
#include <string>

#include "meta/meta_store.h"

namespace tce {

struct MysqlUrl {
  std::string user, password, host, database;
  unsigned port = 3306;
};

// mysql://user:password@host:port/db
Status ParseMysqlUrl(const std::string& url, MysqlUrl* out);
// `server_id`: whose rows this store reads and writes (non-empty).
Status OpenMysqlStore(const std::string& url, const std::string& server_id,
                      std::unique_ptr<MetaStore>* out);

}  // namespace tce
