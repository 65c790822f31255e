// TagInfo <-> its protobuf form, for every place a tag crosses a wire (gRPC
// requests and replies, the ring's peer messages), and the check every tag
// that arrives from one passes first. Pure functions; any thread.
#pragma once

#include <string>

#include "cache/cache_types.h"
#include "common/status.h"
#include "tce/v1/tce.pb.h"

namespace tce {

// A tag as a client or a peer sent it, checked at the boundary: its job and
// tag names, world size, file count, and each file's path and rank (limits
// from common/validate.h). INVALID_ARGUMENT naming the field, with `field`
// the tag's own name in the message ("tag.files[3].path: ...").
Status CheckTag(const v1::TagInfo& t, const std::string& field);

inline void TagToProto(const TagInfo& t, v1::TagInfo* out) {
  out->set_job(t.job);
  out->set_tag(t.tag);
  out->set_complete_unix_ns(t.complete_unix_ns);
  out->set_world_size(t.world_size);
  out->set_version(t.version);
  out->set_epoch(t.epoch);
  for (const TagFile& f : t.files) {
    v1::TagFile* p = out->add_files();
    p->set_rank(f.rank);
    p->set_path(f.path);
    p->set_size(f.size);
    if (f.has_crc32) p->set_crc32(f.crc32);
  }
}

inline TagInfo TagFromProto(const v1::TagInfo& in) {
  TagInfo t;
  t.job = in.job();
  t.tag = in.tag();
  t.complete_unix_ns = in.complete_unix_ns();
  t.world_size = in.world_size();
  t.version = in.version();
  t.epoch = in.epoch();
  t.files.reserve(in.files_size());
  for (const v1::TagFile& f : in.files())
    t.files.push_back(TagFile{f.rank(), f.path(), f.size(), f.crc32(), f.has_crc32()});
  return t;
}

}  // namespace tce
