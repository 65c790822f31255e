// FsIdentity: the filesystem identity (fsuid/fsgid) of the calling thread,
// switched for a scope, so that the kernel checks a client's permissions on
// the files the server writes or reads for it, and the files it creates
// belong to it. Only a root server can (and needs to) switch; uid 0 or -1
// leaves the thread as it is. fsuid and fsgid are per thread.
#pragma once

#include <sys/fsuid.h>
#include <sys/types.h>
#include <unistd.h>

namespace tce {

class FsIdentity {
 public:
  FsIdentity(uid_t uid, gid_t gid) {
    if (geteuid() != 0 || uid == 0 || uid == static_cast<uid_t>(-1)) return;
    if (gid != static_cast<gid_t>(-1)) setfsgid(gid);
    setfsuid(uid);
    switched_ = true;
  }
  ~FsIdentity() {
    if (!switched_) return;
    setfsuid(0);
    setfsgid(0);
  }
  FsIdentity(const FsIdentity&) = delete;
  FsIdentity& operator=(const FsIdentity&) = delete;
  // Whether the switch took (setfsuid reports no failure itself).
  bool ok(uid_t uid) const { return !switched_ || static_cast<uid_t>(setfsuid(static_cast<uid_t>(-1))) == uid; }

 private:
  bool switched_ = false;
};

}  // namespace tce
