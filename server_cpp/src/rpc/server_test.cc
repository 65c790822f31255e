// End to end in one process: the real gRPC service on a Unix socket, the
// real fd socket, a grpc::Channel and a client-side SEQPACKET connection.
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include "common/testing.h"
#include <grp.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <functional>

#include "cache/cache.h"
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
  CacheService service(ClientStores::Of(&cache), sock);
  grpc::ServerBuilder builder;
  builder.RegisterService(&service);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  ASSERT_TRUE(server);
  ControlListener control(server.get(), sock, {getuid()}, static_cast<gid_t>(-1));
  ASSERT_TRUE(control.Start().ok());
  struct stat sb;
  ASSERT_EQ(stat(sock.c_str(), &sb), 0);
  EXPECT_EQ(sb.st_mode & 0777, 0660u);
  FdServer fds(cache.sessions(), cache.publication(), FdServerOptions{sock + ".fd", {getuid()}, 16});
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

// Another uid's connections, for the per-uid caps: root forks a child that
// becomes `nobody` before it connects (SO_PEERCRED records the uid at
// connect). Returns what `fn` returned in that child, or -1.
constexpr uid_t kNobody = 65534;

int AsNobody(const std::function<int()>& fn) {
  int p[2];
  if (pipe(p) != 0) return -1;
  pid_t pid = fork();
  if (pid == 0) {
    close(p[0]);
    int r = -1;
    if (setgroups(0, nullptr) == 0 && setgid(kNobody) == 0 && setuid(kNobody) == 0) r = fn();
    ssize_t ignored = write(p[1], &r, sizeof(r));
    (void)ignored;
    _exit(0);
  }
  close(p[1]);
  int r = -1;
  if (read(p[0], &r, sizeof(r)) != sizeof(r)) r = -1;
  close(p[0]);
  waitpid(pid, nullptr, 0);
  return r;
}

int Connect(const std::string& path, int type) {
  int c = socket(AF_UNIX, type | SOCK_CLOEXEC, 0);
  struct sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::strcpy(addr.sun_path, path.c_str());
  if (connect(c, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    close(c);
    return -1;
  }
  struct timeval tv{10, 0};  // a hung server fails the test instead of hanging it
  setsockopt(c, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  return c;
}

// The code of the SessionHello a new fd-socket connection gets (its
// message in *message); the connection stays open in *conn when given.
int HelloCode(const std::string& path, std::string* message = nullptr, int* conn = nullptr) {
  int c = Connect(path, SOCK_SEQPACKET);
  if (c < 0) return -1;
  char packet[4096];
  ssize_t n = recv(c, packet, sizeof(packet), 0);
  v1::SessionHello hello;
  int code = n > 0 && hello.ParseFromArray(packet, static_cast<int>(n)) ? hello.code() : -1;
  if (message) *message = hello.message();
  if (conn) *conn = c;
  else close(c);
  return code;
}

// Whether gRPC serves a new control-socket connection: it answers the
// HTTP/2 preface with its SETTINGS (a connection the listener refused is
// closed: EOF). The connection stays open in *conn when given.
bool ControlServed(const std::string& path, int* conn = nullptr) {
  static const char kPreface[] = "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\0\0\0\x04\0\0\0\0\0";  // + empty SETTINGS
  int c = Connect(path, SOCK_STREAM);
  if (c < 0) return false;
  char got[64];
  const bool served = send(c, kPreface, sizeof(kPreface) - 1, MSG_NOSIGNAL) ==
                          static_cast<ssize_t>(sizeof(kPreface) - 1) &&
                      recv(c, got, sizeof(got), 0) > 0;
  if (conn) *conn = c;
  else close(c);
  return served;
}

// A connection that is open and handed over but says nothing yet.
int ControlHold(const std::string& path) { return Connect(path, SOCK_STREAM); }

class PerUidCapsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = MakeTempDir("tce-caps");
    sock_ = dir_ + "/tce.sock";
    grpc::ServerBuilder builder;
    builder.RegisterService(&service_);
    server_ = builder.BuildAndStart();
    ASSERT_TRUE(server_);
    chmod(dir_.c_str(), 0711);  // so that `nobody` reaches the sockets
  }
  void TearDown() override {
    if (server_) server_->Shutdown();
    std::filesystem::remove_all(dir_);
  }

  std::string dir_, sock_;
  Cache cache_{64 << 20};
  CacheService service_{ClientStores::Of(&cache_), "unused"};
  std::unique_ptr<grpc::Server> server_;
};

TEST_F(PerUidCapsTest, AUidBeyondItsSessionsIsRefusedAndAnotherUidIsNot) {
  const uid_t me = getuid();
  FdServer fds(cache_.sessions(), cache_.publication(), FdServerOptions{sock_ + ".fd", {me, kNobody}, 16, 2});
  ASSERT_TRUE(fds.Start().ok());
  chmod((sock_ + ".fd").c_str(), 0666);
  int held[2];
  for (int& c : held) ASSERT_EQ(HelloCode(sock_ + ".fd", nullptr, &c), 0);
  std::string message;
  EXPECT_EQ(HelloCode(sock_ + ".fd", &message), static_cast<int>(Status::Code::kResourceExhausted));
  EXPECT_EQ(message, "uid " + std::to_string(me) + " holds 2 sessions (max_sessions_per_uid)");
  EXPECT_EQ(cache_.Stats().sessions, 2u);
  if (geteuid() == 0) {
    EXPECT_EQ(AsNobody([&] { return HelloCode(sock_ + ".fd"); }), 0);
  }
  // One of ours ends: once the server saw it go, we get a session again.
  close(held[0]);
  EXPECT_TRUE(Eventually([&] { return HelloCode(sock_ + ".fd") == 0; }));
  close(held[1]);
  fds.Stop();
  if (geteuid() != 0) GTEST_SKIP() << "another uid's session needs root (fork, setuid)";
}

TEST_F(PerUidCapsTest, AUidBeyondItsControlConnectionsIsClosedAndAnotherUidIsServed) {
  ControlListener control(server_.get(), sock_, {getuid(), kNobody}, static_cast<gid_t>(-1), 16, 2);
  ASSERT_TRUE(control.Start().ok());
  chmod(sock_.c_str(), 0666);
  int held[2] = {ControlHold(sock_), ControlHold(sock_)};  // accepted in order, before the next
  ASSERT_GE(held[0], 0);
  ASSERT_GE(held[1], 0);
  EXPECT_FALSE(ControlServed(sock_));  // the uid's third: closed at once
  if (geteuid() == 0) {
    EXPECT_EQ(AsNobody([&] { return ControlServed(sock_) ? 1 : 0; }), 1);
  }
  // One of ours closes: once gRPC let go of it, the uid is served again.
  close(held[0]);
  EXPECT_TRUE(Eventually([&] { return ControlServed(sock_); }));
  close(held[1]);
  control.Stop();
  if (geteuid() != 0) GTEST_SKIP() << "another uid's connection needs root (fork, setuid)";
}

}  // namespace
}  // namespace tce
