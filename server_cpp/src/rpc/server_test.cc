// End to end in one process: the real gRPC service on a Unix socket, the
// real fd socket, a grpc::Channel and a client-side SEQPACKET connection.
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include "common/testing.h"
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>

#include "rpc/fd_passing.h"
#include "rpc/control_listener.h"
#include "rpc/fd_server.h"
#include "rpc/service.h"

namespace tce {
namespace {

TEST(Server, AllocateWriteCommitLookupOverTheWire) {
  std::string dir = MakeTempDir("tce-srv");
  std::string sock = dir + "/tce.sock";
  Cache cache(64 << 20);
  CacheService service(&cache, sock);
  grpc::ServerBuilder builder;
  builder.RegisterService(&service);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  ASSERT_TRUE(server);
  ControlListener control(server.get(), sock, {getuid()}, static_cast<gid_t>(-1));
  ASSERT_TRUE(control.Start().ok());
  struct stat sb;
  ASSERT_EQ(stat(sock.c_str(), &sb), 0);
  EXPECT_EQ(sb.st_mode & 0777, 0660u);
  FdServer fds(&cache, FdServerOptions{sock + ".fd", {getuid()}, 16});
  ASSERT_TRUE(fds.Start().ok());

  int c = socket(AF_UNIX, SOCK_SEQPACKET, 0);
  struct sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::strcpy(addr.sun_path, (sock + ".fd").c_str());
  ASSERT_EQ(connect(c, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  std::string packet;
  int none;
  ASSERT_TRUE(RecvPacket(c, 4096, &packet, &none).ok());
  v1::SessionHello hello;
  ASSERT_TRUE(hello.ParseFromString(packet));
  ASSERT_EQ(hello.code(), 0);

  auto stub = v1::Cache::NewStub(grpc::CreateChannel("unix:" + sock, grpc::InsecureChannelCredentials()));
  v1::AllocateRequest areq;
  areq.set_session(hello.session());
  areq.set_job("j");
  areq.set_path("/ckpt/x.pt");
  areq.set_size(5000);
  v1::AllocateResponse aresp;
  grpc::ClientContext ctx1;
  ASSERT_TRUE(stub->Allocate(&ctx1, areq, &aresp).ok());

  v1::FdRequest freq;
  freq.set_buffer_id(aresp.buffer_id());
  ASSERT_TRUE(SendPacket(c, freq.SerializeAsString(), -1).ok());
  int memfd;
  ASSERT_TRUE(RecvPacket(c, 4096, &packet, &memfd).ok());
  v1::FdReply reply;
  ASSERT_TRUE(reply.ParseFromString(packet));
  ASSERT_EQ(reply.code(), 0) << reply.message();
  ASSERT_TRUE(reply.writable());
  char* m = static_cast<char*>(mmap(nullptr, aresp.capacity(), PROT_READ | PROT_WRITE, MAP_SHARED, memfd, 0));
  std::memcpy(m, "PK\x03\x04", 4);
  munmap(m, aresp.capacity());
  close(memfd);

  v1::CommitRequest creq;
  creq.set_session(hello.session());
  creq.set_allocation_id(aresp.allocation_id());
  v1::CommitResponse cresp;
  grpc::ClientContext ctx2;
  ASSERT_TRUE(stub->Commit(&ctx2, creq, &cresp).ok());
  EXPECT_EQ(cresp.file().state(), v1::FILE_STATE_CACHED);

  v1::LookupRequest lreq;
  lreq.set_session(hello.session());
  lreq.set_job("j");
  lreq.set_path("/ckpt/missing.pt");
  v1::LookupResponse lresp;
  grpc::ClientContext ctx3;
  grpc::Status st = stub->Lookup(&ctx3, lreq, &lresp);
  EXPECT_EQ(st.error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_EQ(st.error_message(), "/ckpt/missing.pt is not cached for job j");

  v1::StatusResponse sresp;
  grpc::ClientContext ctx5;
  EXPECT_EQ(stub->Status(&ctx5, v1::StatusRequest(), &sresp).error_code(),
            grpc::StatusCode::UNAUTHENTICATED);  // every call runs in a session
  v1::StatusRequest sreq;
  sreq.set_session(hello.session());
  grpc::ClientContext ctx4;
  ASSERT_TRUE(stub->Status(&ctx4, sreq, &sresp).ok());
  EXPECT_EQ(sresp.files(), 1u);
  EXPECT_EQ(sresp.sessions(), 1u);

  close(c);  // the session ends with the connection
  for (int i = 0; i < 200 && cache.Stats().sessions; ++i) usleep(10000);
  EXPECT_EQ(cache.Stats().sessions, 0u);
  fds.Stop();
  control.Stop();
  server->Shutdown();
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace tce
