// FileState <-> tce.v1.FileState, from the table in cache/file_state.h, for
// every place a file's state crosses a wire.
#pragma once

#include "cache/file_state.h"
#include "tce/v1/tce.pb.h"

namespace tce {

// The C++ numbers are the proto's: arrays indexed by state and the
// database's history rely on it.
#define TCE_FILE_STATE_SAME_NUMBER(e, proto, number, stored, label) \
  static_assert(static_cast<int>(FileState::e) == v1::proto && v1::proto == number, #e);
TCE_FILE_STATES(TCE_FILE_STATE_SAME_NUMBER)
#undef TCE_FILE_STATE_SAME_NUMBER

inline v1::FileState FileStateToProto(FileState s) {
  switch (s) {
#define TCE_FILE_STATE_CASE(e, proto, number, stored, label) \
  case FileState::e:                                         \
    return v1::proto;
    TCE_FILE_STATES(TCE_FILE_STATE_CASE)
#undef TCE_FILE_STATE_CASE
  }
  return v1::FILE_STATE_UNSPECIFIED;
}

// False for FILE_STATE_UNSPECIFIED and any number outside the table.
inline bool FileStateFromProto(int value, FileState* out) {
  switch (value) {
#define TCE_FILE_STATE_CASE(e, proto, number, stored, label) \
  case v1::proto:                                            \
    *out = FileState::e;                                     \
    return true;
    TCE_FILE_STATES(TCE_FILE_STATE_CASE)
#undef TCE_FILE_STATE_CASE
  }
  return false;
}

}  // namespace tce
