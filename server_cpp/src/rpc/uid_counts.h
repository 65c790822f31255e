// UidCounts: how many of one kind of thing (sessions, control connections,
// range buffers) each local uid holds, against a cap per uid, so that one
// user cannot take what every other user of the node needs. Take before
// handing one out, Give when it goes. Not thread-safe: its owner serializes
// the calls (a loop thread, or its own lock).
#pragma once

#include <sys/types.h>

#include <cstddef>
#include <map>
#include <string>

#include "common/status.h"

namespace tce {

class UidCounts {
 public:
  // `what`: the things counted, plural ("sessions"); `setting`: the cap's
  // name, so that a refusal says what to raise.
  UidCounts(size_t max_per_uid, std::string what, std::string setting)
      : max_(max_per_uid), what_(std::move(what)), setting_(std::move(setting)) {}

  // Counts one more for `uid`, or RESOURCE_EXHAUSTED (nothing counted) when
  // it holds the cap already: "uid 1001 holds 256 sessions (max_sessions_per_uid)".
  Status Take(uid_t uid);
  // One of `uid`'s went.
  void Give(uid_t uid);
  size_t held(uid_t uid) const;

 private:
  const size_t max_;
  const std::string what_;
  const std::string setting_;
  std::map<uid_t, size_t> held_;  // only uids holding at least one
};

}  // namespace tce
