// TagInfo <-> its protobuf form, for every place a tag crosses a wire (gRPC
// replies, the ring's peer messages).
#pragma once

#include "cache/cache_types.h"
#include "tce/v1/tce.pb.h"

namespace tce {

inline void TagToProto(const TagInfo& t, v1::TagInfo* out) {
  out->set_job(t.job);
  out->set_tag(t.tag);
  out->set_complete_unix_ns(t.complete_unix_ns);
  out->set_world_size(t.world_size);
  for (const TagFile& f : t.files) {
    v1::TagFile* p = out->add_files();
    p->set_rank(f.rank);
    p->set_path(f.path);
    p->set_size(f.size);
  }
}

inline TagInfo TagFromProto(const v1::TagInfo& in) {
  TagInfo t;
  t.job = in.job();
  t.tag = in.tag();
  t.complete_unix_ns = in.complete_unix_ns();
  t.world_size = in.world_size();
  t.files.reserve(in.files_size());
  for (const v1::TagFile& f : in.files()) t.files.push_back(TagFile{f.rank(), f.path(), f.size()});
  return t;
}

}  // namespace tce
