#include "common/status.h"

#include <cerrno>
#include <cstring>

namespace tce {

Status Status::FromErrno(int err, const std::string& context) {
  std::string msg = context + ": " + std::strerror(err);
  switch (err) {
    case ENOMEM: case ENOSPC: case EDQUOT: case EMFILE: case ENFILE: case ENOBUFS:
      return ResourceExhausted(msg);
    case EACCES: case EPERM: case EROFS:
      return PermissionDenied(msg);
    default:
      return Internal(msg);
  }
}

const char* CodeName(Status::Code code) {
  static const char* const kNames[] = {
      "OK", "CANCELLED", "UNKNOWN", "INVALID_ARGUMENT", "DEADLINE_EXCEEDED",
      "NOT_FOUND", "ALREADY_EXISTS", "PERMISSION_DENIED", "RESOURCE_EXHAUSTED",
      "FAILED_PRECONDITION", "ABORTED", "OUT_OF_RANGE", "UNIMPLEMENTED",
      "INTERNAL", "UNAVAILABLE", "DATA_LOSS", "UNAUTHENTICATED"};
  int i = static_cast<int>(code);
  return (i >= 0 && i <= 16) ? kNames[i] : "UNKNOWN";
}

std::string Status::ToString() const {
  if (ok()) return "OK";
  return std::string(CodeName(code_)) + ": " + message_;
}

}  // namespace tce
