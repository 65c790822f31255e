#include "cache/file_state.h"

namespace tce {
namespace {

const FileStateRow* Find(FileState s) {
  for (const FileStateRow& row : kFileStates)
    if (row.state == s) return &row;
  return nullptr;
}

}  // namespace

const char* FileStateName(FileState s) {
  const FileStateRow* row = Find(s);
  return row ? row->stored_name : "UNSPECIFIED";
}

bool ParseFileState(const std::string& name, FileState* out) {
  for (const FileStateRow& row : kFileStates) {
    if (name == row.stored_name) {
      *out = row.state;
      return true;
    }
  }
  return false;
}

const char* FileStateLabel(FileState s) {
  const FileStateRow* row = Find(s);
  return row ? row->metrics_label : "unspecified";
}

}  // namespace tce
