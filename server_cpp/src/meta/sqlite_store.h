// The SQLite MetaStore, created through OpenMetaStore (meta/meta_store.h).
#pragma once

#include <memory>
#include <string>

#include "meta/meta_store.h"

namespace tce {

// Opens (creating, migrating) the database at the absolute `path`, held
// exclusively while the store lives.
Status OpenSqliteStore(const std::string& path, std::unique_ptr<MetaStore>* out);

}  // namespace tce
