// Record <-> its protobuf form, for every place a record table crosses a
// wire (gRPC replies, the ring's peer messages).
#pragma once

#include <vector>

#include "cache/cache_types.h"
#include "tce/v1/tce.pb.h"

namespace tce {

template <typename Repeated>
void RecordsToProto(const std::vector<Record>& records, Repeated* out) {
  for (const Record& r : records) {
    v1::Record* p = out->Add();
    p->set_name(r.name);
    p->set_header_offset(r.header_offset);
    p->set_data_offset(r.data_offset);
    p->set_size(r.size);
    p->set_crc32(r.crc32);
    p->set_central_offset(r.central_offset);
  }
}

template <typename Repeated>
std::vector<Record> RecordsFromProto(const Repeated& in, bool keep_crc = true) {
  std::vector<Record> out;
  out.reserve(in.size());
  for (const v1::Record& p : in)
    out.push_back(Record{p.name(), p.header_offset(), p.data_offset(), p.size(),
                         keep_crc ? p.crc32() : 0, p.central_offset()});
  return out;
}

// A storage identity for another node: no device numbers (they are this
// node's own); nothing when it is not known.
inline void DiskToProto(const DiskIdentity& d, v1::StorageIdentity* out) {
  out->set_exists(d.exists);
  out->set_written(d.written);
  out->set_ino(d.ino);
  out->set_size(d.size);
  out->set_mtime_ns(d.mtime_ns);
  out->set_dir_ino(d.dir_ino);
  out->set_parent_ino(d.parent_ino);
  out->set_etag(d.etag);
}

inline DiskIdentity DiskFromProto(const v1::StorageIdentity& p) {
  DiskIdentity d;
  d.known = true;
  d.from_peer = true;
  d.exists = p.exists();
  d.written = p.written();
  d.ino = p.ino();
  d.size = p.size();
  d.mtime_ns = p.mtime_ns();
  d.dir_ino = p.dir_ino();
  d.parent_ino = p.parent_ino();
  d.etag = p.etag().substr(0, 1024);
  return d;
}

}  // namespace tce
