#include "storage/object_owner.h"

namespace tce {

uint32_t ParseOwner(const std::string& value) {
  if (value.empty() || value.size() > 10 || (value.size() > 1 && value[0] == '0')) return kNoUid;
  uint64_t uid = 0;
  for (char c : value) {
    if (c < '0' || c > '9') return kNoUid;
    uid = uid * 10 + static_cast<uint64_t>(c - '0');
  }
  return uid < kNoUid ? static_cast<uint32_t>(uid) : kNoUid;
}

Status MayUse(const Requester& who, const ObjectId& o, const std::string& url, const char* act) {
  if (!o.exists || !o.owned || who.admin || (o.owner == who.uid && who.uid != kNoUid)) return Status::OK();
  const std::string owner = o.owner == kNoUid ? "an owner this server cannot read" : "uid " + std::to_string(o.owner);
  const std::string caller = who.uid == kNoUid ? "a job with no owner" : "uid " + std::to_string(who.uid);
  return Status::PermissionDenied(caller + " may not " + act + " " + url + ": it belongs to " + owner);
}

}  // namespace tce
