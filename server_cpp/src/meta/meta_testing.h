// Test helpers for the metadata stores' gtests. Not linked into the server.
#pragma once

#include <string>

#include "meta/meta_store.h"

namespace tce {

// A file of job "job" in `state`, with records whose names hold the column
// format's separators.
inline FileInfo File(const std::string& path, FileState state, const std::string& tag = "step1") {
  FileInfo f;
  f.job = "job";
  f.tag = tag;
  f.path = path;
  f.rank = 3;
  f.size = 4242;
  f.state = state;
  f.version = 17;
  f.committed_unix_ns = 1000;
  f.owner_uid = 1000;
  f.owner_gid = 100;
  f.records = {{"we;ird,name\nx/data/0", 0, 64, 100, 0, 300}, {"x/version", 200, 256, 2, 7, 360}};
  f.records[0].crc32 = 0xdeadbeef;
  return f;
}

}  // namespace tce
