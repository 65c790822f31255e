#include "rpc/parse_errors.h"

#include <google/protobuf/stubs/logging.h>

#include <string>

#include "common/logging.h"

namespace tce {
namespace {

// The field protobuf last refused while parsing on this thread ("" if none).
thread_local std::string t_bad_utf8_field;

void OnProtobufLog(google::protobuf::LogLevel level, const char* file, int line,
                   const std::string& message) {
  // "String field 'tce.v1.AllocateRequest.path' contains invalid UTF-8 data
  // when parsing a protocol buffer. ..." The request is refused with the
  // field named; logging it too would let any client flood the log.
  if (message.find("invalid UTF-8") != std::string::npos &&
      message.find("when parsing") != std::string::npos) {
    size_t open = message.find('\'');
    size_t close = open == std::string::npos ? open : message.find('\'', open + 1);
    t_bad_utf8_field = close == std::string::npos ? "?" : message.substr(open + 1, close - open - 1);
    return;
  }
  if (level >= google::protobuf::LOGLEVEL_ERROR) {
    TCE_LOG(kError, "protobuf") << file << ":" << line << ": " << message;
  } else {
    TCE_LOG(kWarning, "protobuf") << file << ":" << line << ": " << message;
  }
}

class ParseErrorInterceptor final : public grpc::experimental::Interceptor {
 public:
  explicit ParseErrorInterceptor(const char* method) : method_(method ? method : "?") {}

  void Intercept(grpc::experimental::InterceptorBatchMethods* m) override {
    using grpc::experimental::InterceptionHookPoints;
    if (m->QueryInterceptionHookPoint(InterceptionHookPoints::POST_RECV_MESSAGE)) {
      if (m->GetRecvMessage() == nullptr) {
        unparsed_ = true;
        field_ = t_bad_utf8_field;
      }
      t_bad_utf8_field.clear();
    }
    if (unparsed_ && m->QueryInterceptionHookPoint(InterceptionHookPoints::PRE_SEND_STATUS) &&
        m->GetSendStatus().error_code() == grpc::StatusCode::INTERNAL) {
      std::string message;
      if (!field_.empty()) {
        const size_t dot = field_.rfind('.');
        message = (dot == std::string::npos ? field_ : field_.substr(dot + 1)) +
                  ": is not valid UTF-8 (field " + field_ + ")";
      } else {
        message = "malformed request to " + method_ + ": not a valid protobuf message";
      }
      m->ModifySendStatus(grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, message));
    }
    m->Proceed();
  }

 private:
  const std::string method_;
  bool unparsed_ = false;
  std::string field_;
};

class Factory final : public grpc::experimental::ServerInterceptorFactoryInterface {
 public:
  grpc::experimental::Interceptor* CreateServerInterceptor(
      grpc::experimental::ServerRpcInfo* info) override {
    return new ParseErrorInterceptor(info->method());
  }
};

}  // namespace

void InstallProtobufLogHandler() { google::protobuf::SetLogHandler(&OnProtobufLog); }

std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface> NewParseErrorInterceptorFactory() {
  return std::make_unique<Factory>();
}

}  // namespace tce
