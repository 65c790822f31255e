// Every state a file can be in, in one table. A row names the C++
// enumerator, its tce.v1.FileState value (the same number), the name the
// metadata stores write (the proto name without FILE_STATE_) and the
// `state` label of the tce_files metric. The enum, the names and the proto
// mapping (cache/file_state_proto.h) all come from it; file_state_test.cc
// checks it against the proto. Numbers and stored names never change:
// databases and clients keep them. Pure functions; any thread.
#pragma once

#include <string>

// X(enumerator, proto value, number, stored name, metrics label)
#define TCE_FILE_STATES(X)                                                                        \
  X(kPending, FILE_STATE_PENDING, 1, "PENDING", "pending")         /* client writing the buffer */ \
  X(kCached, FILE_STATE_CACHED, 2, "CACHED", "cached")             /* committed */                 \
  X(kBackedUp, FILE_STATE_BACKED_UP, 3, "BACKED_UP", "backed_up")  /* and a copy on the next node */ \
  X(kPersisted, FILE_STATE_PERSISTED, 4, "PERSISTED", "persisted") /* durable on storage */        \
  X(kFailed, FILE_STATE_FAILED, 5, "FAILED", "failed")             /* see FileInfo::reason */      \
  X(kEvicted, FILE_STATE_EVICTED, 6, "EVICTED", "evicted")         /* only storage holds it */     \
  X(kDiscarded, FILE_STATE_DISCARDED, 7, "DISCARDED", "discarded") /* dropped: its path changed */

namespace tce {

enum class FileState {
#define TCE_FILE_STATE_ENUMERATOR(e, proto, number, stored, label) e = number,
  TCE_FILE_STATES(TCE_FILE_STATE_ENUMERATOR)
#undef TCE_FILE_STATE_ENUMERATOR
};

struct FileStateRow {
  FileState state;
  const char* stored_name;
  const char* metrics_label;
};

// The table, in number order.
inline constexpr FileStateRow kFileStates[] = {
#define TCE_FILE_STATE_ROW(e, proto, number, stored, label) {FileState::e, stored, label},
    TCE_FILE_STATES(TCE_FILE_STATE_ROW)
#undef TCE_FILE_STATE_ROW
};

// Slots for an array indexed by a state's number (0 unused).
inline constexpr int kFileStateSlots = static_cast<int>(sizeof(kFileStates) / sizeof(kFileStates[0])) + 1;
constexpr bool FileStatesNumberedInOrder() {
  for (int i = 1; i < kFileStateSlots; ++i)
    if (static_cast<int>(kFileStates[i - 1].state) != i) return false;
  return true;
}
static_assert(FileStatesNumberedInOrder(), "file states are numbered 1, 2, ... in table order");

// The stored name ("UNSPECIFIED" for a value outside the table).
const char* FileStateName(FileState s);
// The stored name back to its state; false for any other text.
bool ParseFileState(const std::string& name, FileState* out);
// The metrics label ("unspecified" for a value outside the table).
const char* FileStateLabel(FileState s);

}  // namespace tce
