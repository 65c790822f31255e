#include "rpc/fd_passing.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#include "cache/buffer.h"

namespace tce {

TEST(FdPassing, MemfdCrossesASeqpacketSocket) {
  int sv[2];
  ASSERT_EQ(socketpair(AF_UNIX, SOCK_SEQPACKET, 0, sv), 0);
  std::unique_ptr<Buffer> b;
  ASSERT_TRUE(Buffer::Create(1, 8192, &b).ok());
  int ro = -1;
  ASSERT_TRUE(b->NewFd(false, &ro).ok());
  ASSERT_TRUE(SendPacket(sv[0], "reply", ro).ok());
  close(ro);
  std::string data;
  int got = -1;
  ASSERT_TRUE(RecvPacket(sv[1], 4096, &data, &got).ok());
  EXPECT_EQ(data, "reply");
  ASSERT_GE(got, 0);
  EXPECT_TRUE(fcntl(got, F_GETFD) & FD_CLOEXEC);
  // read-only: no shared writable mapping
  EXPECT_EQ(mmap(nullptr, 8192, PROT_READ | PROT_WRITE, MAP_SHARED, got, 0), MAP_FAILED);
  EXPECT_NE(mmap(nullptr, 8192, PROT_READ, MAP_SHARED, got, 0), MAP_FAILED);
  close(got);
  close(sv[0]);
  close(sv[1]);
}

TEST(FdPassing, OversizedPacketAndEof) {
  int sv[2];
  ASSERT_EQ(socketpair(AF_UNIX, SOCK_SEQPACKET, 0, sv), 0);
  ASSERT_TRUE(SendPacket(sv[0], std::string(5000, 'x'), -1).ok());
  std::string data;
  int fd;
  EXPECT_EQ(RecvPacket(sv[1], 4096, &data, &fd).code(), Status::Code::kInvalidArgument);
  close(sv[0]);
  ASSERT_TRUE(RecvPacket(sv[1], 4096, &data, &fd).ok());
  EXPECT_TRUE(data.empty());
  close(sv[1]);
}

}  // namespace tce
