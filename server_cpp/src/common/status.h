// Status: the result of an operation that can fail (after LevelDB).
// Codes are numbered like google.rpc.Code so they map 1:1 onto gRPC.
// Immutable value type; safe to copy between threads.
#pragma once

#include <string>
#include <utility>

namespace tce {

class [[nodiscard]] Status {
 public:
  enum class Code : int {
    kOk = 0,
    kCancelled = 1,
    kUnknown = 2,
    kInvalidArgument = 3,
    kDeadlineExceeded = 4,
    kNotFound = 5,
    kAlreadyExists = 6,
    kPermissionDenied = 7,
    kResourceExhausted = 8,
    kFailedPrecondition = 9,
    kAborted = 10,
    kOutOfRange = 11,
    kUnimplemented = 12,
    kInternal = 13,
    kUnavailable = 14,
    kDataLoss = 15,
    kUnauthenticated = 16,
  };

  Status() = default;
  static Status OK() { return Status(); }
  static Status InvalidArgument(std::string m) { return Status(Code::kInvalidArgument, std::move(m)); }
  static Status NotFound(std::string m) { return Status(Code::kNotFound, std::move(m)); }
  static Status PermissionDenied(std::string m) { return Status(Code::kPermissionDenied, std::move(m)); }
  static Status ResourceExhausted(std::string m) { return Status(Code::kResourceExhausted, std::move(m)); }
  static Status FailedPrecondition(std::string m) { return Status(Code::kFailedPrecondition, std::move(m)); }
  static Status Unauthenticated(std::string m) { return Status(Code::kUnauthenticated, std::move(m)); }
  static Status Unavailable(std::string m) { return Status(Code::kUnavailable, std::move(m)); }
  static Status DeadlineExceeded(std::string m) { return Status(Code::kDeadlineExceeded, std::move(m)); }
  static Status Aborted(std::string m) { return Status(Code::kAborted, std::move(m)); }
  static Status Cancelled(std::string m) { return Status(Code::kCancelled, std::move(m)); }
  static Status NotSupported(std::string m) { return Status(Code::kUnimplemented, std::move(m)); }
  static Status Internal(std::string m) { return Status(Code::kInternal, std::move(m)); }
  static Status DataLoss(std::string m) { return Status(Code::kDataLoss, std::move(m)); }
  // A code received from elsewhere (a peer's reply).
  static Status FromCode(Code code, std::string m) { return Status(code, std::move(m)); }
  // An OS error: running out (ENOMEM, ENOSPC, EDQUOT, EMFILE, ENFILE,
  // ENOBUFS) is ResourceExhausted, a refusal (EACCES, EPERM, EROFS)
  // PermissionDenied, anything else Internal.
  static Status FromErrno(int err, const std::string& context);

  bool ok() const { return code_ == Code::kOk; }
  Code code() const { return code_; }
  const std::string& message() const { return message_; }
  std::string ToString() const;

 private:
  Status(Code code, std::string message) : code_(code), message_(std::move(message)) {}
  Code code_ = Code::kOk;
  std::string message_;
};

const char* CodeName(Status::Code code);

}  // namespace tce
