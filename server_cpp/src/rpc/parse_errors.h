// Requests that cannot be parsed get INVALID_ARGUMENT naming the field.
//
// gRPC parses a request before any handler runs; when the parse fails (a
// proto3 string field holding invalid UTF-8, or bytes that are no message at
// all) it answers INTERNAL with an empty message. The interceptor made here
// turns that into INVALID_ARGUMENT: "path: is not valid UTF-8 (field
// tce.v1.AllocateRequest.path)", or "malformed request to <method>" when no
// field is known. The field comes from protobuf's own report of the bad
// string, which InstallProtobufLogHandler routes here (on the parsing thread,
// which is the thread that then runs the interceptor) instead of stderr.
//
// Input is untrusted bytes from any local process. Install the log handler
// once, in main, before serving (protobuf's SetLogHandler is not
// thread-safe); the interceptor factory is registered with the ServerBuilder.
#pragma once

#include <memory>

#include <grpcpp/support/server_interceptor.h>

namespace tce {

void InstallProtobufLogHandler();
std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface> NewParseErrorInterceptorFactory();

}  // namespace tce
