// Object owners: an object root has no directories or file modes for the
// kernel to check, so the server keeps each object its owner's. Every object
// it writes records the uid that saved it (user metadata `tce-uid`, so it
// lasts as long as the object, across restarts and servers), and before any
// read, listing, delete or replacement the server compares it with the uid
// the call is for: another uid's object is refused (PERMISSION_DENIED), as a
// 0600 file would be; the owner itself and an administrator pass. An object
// with no owner recorded (written by an earlier server, or by another tool
// with the bucket's keys) is every uid's, as a file all may read and write;
// a save over it records its saver. See docs/security.md (Object storage).
//
// Plain functions of their arguments; any thread.
#pragma once

#include <cstdint>
#include <string>

#include "common/status.h"
#include "storage/identity.h"

namespace tce {

// The user-metadata name the owner's uid is recorded under (x-amz-meta-tce-uid).
constexpr char kOwnerMetadata[] = "tce-uid";
// The one the write that made the object is recorded under (x-amz-meta-tce-write).
constexpr char kWriteMetadata[] = "tce-write";
// A uid no process has: what an owner the server cannot read stands for.
constexpr uint32_t kNoUid = static_cast<uint32_t>(-1);

// Whom a call on an object is for: the session's uid (SO_PEERCRED), or the
// uid that owns the job it is made for; never a uid a request names.
struct Requester {
  uint32_t uid = kNoUid;
  bool admin = false;  // root while root_is_admin: may act on every object
};

// OK when `who` may `act` ("read", "list", "delete", "replace") the object
// `url` holding `o`: absent, no owner recorded, `who`'s own, or `who` is an
// administrator. Otherwise PERMISSION_DENIED, e.g. "uid 1002 may not read
// s3://b/run1/a.pt: it belongs to uid 1001".
Status MayUse(const Requester& who, const ObjectId& o, const std::string& url, const char* act);

// The owner a recorded `tce-uid` value names: a decimal uid below kNoUid;
// anything else names kNoUid (an owner nobody but an administrator is).
uint32_t ParseOwner(const std::string& value);

}  // namespace tce
