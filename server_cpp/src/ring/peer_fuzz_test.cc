// Bounded random-input loops for every decoder that takes bytes from a
// peer: frames before and after authentication, the handshake, the record
// tables a backup or a recovery carries, and the tags a peer sends. Each
// iteration must end in a Status, never a crash (the sanitizer build runs
// these too); a ranged read with any numbers gets a checked answer on a link
// that stays in step. The seed is fixed, so a failure reproduces;
// TCE_FUZZ_ITERATIONS scales the loops.
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#include <csignal>
#include <cstdlib>
#include <random>
#include <thread>

#include "cache/record_proto.h"
#include "cache/tag_registry.h"
#include "persist/crc.h"
#include "ring/backup_store.h"
#include "ring/peer_link.h"
#include "ring/peer_testing.h"
#include "ring/peer_server.h"
#include "ring/range_read.h"
#include "ring/tcp_transport.h"
#include "tce/v1/tce.pb.h"

namespace tce {
namespace {
using namespace std::chrono_literals;

int Iterations(int base) {
  const char* env = std::getenv("TCE_FUZZ_ITERATIONS");
  return env ? std::max(1, std::atoi(env)) : base;
}

std::string RandomBytes(std::mt19937_64& rng, size_t max) {
  std::string s(rng() % (max + 1), '\0');
  for (char& c : s) c = static_cast<char>(rng());
  return s;
}

// A frame: a length prefix (sometimes lying) and random bytes, sometimes a
// mutated valid message.
std::string RandomFrame(std::mt19937_64& rng) {
  std::string body;
  if (rng() % 6 == 0) {
    v1::PeerRequest req;
    v1::PeerReadRange* r = req.mutable_read_range();
    r->set_job(RandomBytes(rng, 16));
    r->set_path(RandomBytes(rng, 32));
    r->set_offset(rng());
    r->set_length(rng());
    body = req.SerializeAsString();
    for (int flips = static_cast<int>(rng() % 4); flips > 0 && !body.empty(); --flips)
      body[rng() % body.size()] = static_cast<char>(rng());
  } else if (rng() % 3 == 0) {
    v1::PeerRequest req;
    v1::PeerBackup* b = req.mutable_backup();
    b->set_job(RandomBytes(rng, 16));
    b->set_path(RandomBytes(rng, 32));
    b->set_size(rng());
    for (int i = 0, n = static_cast<int>(rng() % 4); i < n; ++i) {
      v1::Record* r = b->add_records();
      r->set_data_offset(rng());
      r->set_size(rng());
    }
    body = req.SerializeAsString();
    for (int flips = static_cast<int>(rng() % 4); flips > 0 && !body.empty(); --flips)
      body[rng() % body.size()] = static_cast<char>(rng());
  } else {
    body = RandomBytes(rng, 512);
  }
  uint32_t n = static_cast<uint32_t>(body.size());
  if (rng() % 8 == 0) n = static_cast<uint32_t>(rng());  // a lie
  std::string frame(4, '\0');
  for (int i = 0; i < 4; ++i) frame[i] = static_cast<char>(n >> (8 * i));
  return frame + body;
}

TEST(PeerFuzz, UnauthenticatedFramesEndInAStatus) {
  std::mt19937_64 rng(1);
  for (int it = 0; it < Iterations(3000); ++it) {
    int sv[2];
    ASSERT_EQ(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);
    std::unique_ptr<PeerLink> link = PeerLink::Adopt(sv[0], 200ms);
    const std::string frame = RandomFrame(rng);
    ASSERT_EQ(send(sv[1], frame.data(), frame.size(), MSG_NOSIGNAL), static_cast<ssize_t>(frame.size()));
    shutdown(sv[1], SHUT_WR);  // a short frame ends instead of waiting
    v1::PeerRequest req;
    Status s = link->Recv(&req);
    const uint32_t n = static_cast<unsigned char>(frame[0]) | static_cast<unsigned char>(frame[1]) << 8 |
                       static_cast<unsigned char>(frame[2]) << 16 |
                       static_cast<uint32_t>(static_cast<unsigned char>(frame[3])) << 24;
    if (s.ok()) EXPECT_LE(n, kMaxHandshakeMessage);
    if (n > kMaxHandshakeMessage) EXPECT_EQ(s.code(), Status::Code::kInvalidArgument) << s.ToString();
    close(sv[1]);
  }
}

TEST(PeerFuzz, GarbageNeverAuthenticates) {
  std::mt19937_64 rng(2);
  for (int it = 0; it < Iterations(500); ++it) {
    int sv[2];
    ASSERT_EQ(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);
    std::string junk;
    for (int frames = 1 + static_cast<int>(rng() % 3); frames > 0; --frames) junk += RandomFrame(rng);
    std::thread writer([&] {
      (void)!send(sv[1], junk.data(), junk.size(), MSG_NOSIGNAL);
      shutdown(sv[1], SHUT_WR);
    });
    std::unique_ptr<PeerLink> link = PeerLink::Adopt(sv[0], 200ms);
    Status s = link->AcceptHandshake("127.0.0.1:1", "token", 500ms);
    writer.join();
    EXPECT_FALSE(s.ok());
    EXPECT_FALSE(link->authenticated());
    close(sv[1]);
  }
}

TEST(PeerFuzz, RecordTablesFromPeersAreCheckedNotTrusted) {
  std::mt19937_64 rng(3);
  const size_t size = 8192;
  int fd = memfd_create("fuzz", MFD_CLOEXEC);
  ASSERT_GE(fd, 0);
  const std::string content = RandomBytes(rng, size) + std::string(size, 'x');
  ASSERT_EQ(write(fd, content.data(), size), static_cast<ssize_t>(size));
  const auto* data = reinterpret_cast<const unsigned char*>(content.data());
  for (int it = 0; it < Iterations(20000); ++it) {
    v1::PeerBackup header;
    if (!header.ParseFromString(RandomBytes(rng, 128))) header.Clear();
    for (int i = 0, n = static_cast<int>(rng() % 5); i < n; ++i) {
      v1::Record* r = header.add_records();
      const bool near = rng() % 2;  // offsets near the file, or anywhere
      r->set_header_offset(near ? rng() % (size + 64) : rng());
      r->set_data_offset(near ? rng() % (size + 64) : rng());
      r->set_size(near ? rng() % (size + 64) : rng());
      r->set_central_offset(near ? rng() % (size + 64) : rng());
      r->set_crc32(static_cast<uint32_t>(rng()));
    }
    std::vector<Record> records = RecordsFromProto(header.records());
    Status v = VerifyRecords(data, size, records);
    Status z = ValidateZipTable(fd, size, records);
    RecordCrcs crcs(records);
    for (uint64_t off = 0; off < size; off += 1000) crcs.Feed(off, data + off, std::min<size_t>(1000, size - off));
    Status c = CompareCrcs(records, crcs.crcs());
    EXPECT_EQ(crcs.crcs().size(), records.size());
    (void)v;
    (void)z;
    (void)c;
  }
  close(fd);
}

TEST(PeerFuzz, RangedReadsFromPeersAreCheckedNotTrusted) {
  signal(SIGPIPE, SIG_IGN);
  std::mt19937_64 rng(4);
  const uint64_t size = 10000;
  BackupStore store(16 << 20);
  std::unique_ptr<MappedBuffer> buf;
  ASSERT_TRUE(store.Reserve("j", "/f", size, &buf).ok());
  const std::string content = RandomBytes(rng, size) + std::string(size, 'x');
  memcpy(buf->data(), content.data(), size);
  HeldBackup h;
  h.file.job = "j";
  h.file.path = "/f";
  h.file.size = size;
  h.owner = "127.0.0.1:1";
  h.buffer = std::move(buf);
  store.Commit(std::move(h));
  std::unique_ptr<Transport> transport = NewTcpTransport(1);
  PeerServer server(LoopbackPeerOptions(), transport.get(), &store);
  ASSERT_TRUE(server.Start().ok());
  std::unique_ptr<PeerLink> link;
  ASSERT_TRUE(PeerLink::Connect(server.endpoint(), "127.0.0.1:1", "t", 2000ms, &link).ok());
  for (int it = 0; it < Iterations(2000); ++it) {
    v1::PeerRequest req;
    v1::PeerReadRange* r = req.mutable_read_range();
    const int kind = static_cast<int>(rng() % 4);
    r->set_job(kind == 0 ? "j" + std::to_string(rng() % 100) : "j");  // valid UTF-8: else the link ends
    r->set_path(kind == 1 ? "/f" + std::to_string(rng() % 100) : "/f");
    const bool near = rng() % 2;
    r->set_offset(near ? rng() % (size + 64) : rng());
    r->set_length(near ? rng() % (size + 64) : rng() % 3 == 0 ? rng() : rng() % (kMaxRangeLength + 64));
    r->set_raw(rng() % 2);
    r->set_job_uid(0);  // the held copy's (the job's uid on its node)
    ASSERT_TRUE(link->Send(req).ok());
    v1::PeerRangeReply reply;
    ASSERT_TRUE(link->Recv(&reply).ok()) << "iteration " << it;  // always an answer, in step
    if (reply.code() != 0 || !r->raw()) {
      EXPECT_EQ(reply.raw_length(), 0u);
    } else {  // exactly the announced bytes follow, and only those
      ASSERT_EQ(reply.raw_length(), r->length());
      ASSERT_TRUE(reply.data().empty());
      reply.mutable_data()->resize(reply.raw_length());
      ASSERT_TRUE(link->RecvAll(&(*reply.mutable_data())[0], reply.raw_length()).ok()) << "iteration " << it;
    }
    const Status want = CheckRange(r->offset(), r->length(), size);
    if (r->job() != "j" || r->path() != "/f") {
      EXPECT_NE(reply.code(), 0);
      EXPECT_TRUE(reply.data().empty());
    } else if (!want.ok()) {
      EXPECT_EQ(reply.code(), static_cast<int>(want.code())) << reply.message();
      EXPECT_TRUE(reply.data().empty());
    } else {
      ASSERT_EQ(reply.code(), 0) << reply.message();
      EXPECT_EQ(reply.data(), content.substr(r->offset(), r->length()));
      EXPECT_EQ(reply.crc32(),
                Crc32(0, reinterpret_cast<const unsigned char*>(reply.data().data()), reply.data().size()));
    }
  }
  server.Stop();
}

// Mutated tags from an authenticated peer: each gets a verdict, the server
// keeps serving, and what it holds passes the checks a client's tag does.
TEST(PeerFuzz, TagsFromPeersAreCheckedNotTrusted) {
  signal(SIGPIPE, SIG_IGN);
  std::mt19937_64 rng(4);
  std::unique_ptr<Transport> transport = NewTcpTransport(1);
  BackupStore store(1 << 20);
  PeerServer server(LoopbackPeerOptions(), transport.get(), &store);
  ASSERT_TRUE(server.Start().ok());
  std::unique_ptr<PeerLink> link;
  ASSERT_TRUE(PeerLink::Connect(server.endpoint(), "127.0.0.1:1", "t", 2000ms, &link).ok());
  int accepted = 0;
  for (int it = 0; it < Iterations(2000); ++it) {
    v1::PeerRequest req;
    v1::TagInfo* t = req.mutable_tag()->mutable_tag();
    t->set_job(rng() % 8 ? "job" : RandomBytes(rng, 8));
    t->set_tag("step" + std::to_string(rng() % 16));
    t->set_complete_unix_ns(static_cast<int64_t>(rng() % 3 ? rng() % 1000 : rng()));
    t->set_world_size(static_cast<int32_t>(rng() % 4 ? rng() % 8 : rng()));
    for (int i = 0, n = static_cast<int>(rng() % 5); i < n; ++i) {
      v1::TagFile* f = t->add_files();
      f->set_rank(static_cast<int32_t>(rng() % 4 ? rng() % 8 : rng()));
      f->set_path(rng() % 4 ? "/ckpt/f" + std::to_string(rng() % 6) : RandomBytes(rng, 12));
      f->set_size(rng());
    }
    req.mutable_tag()->set_owner_node(static_cast<int32_t>(rng() % 4 ? rng() % 4 : rng()));
    std::string body = req.SerializeAsString();
    if (rng() % 4 == 0)
      for (int flips = 1 + static_cast<int>(rng() % 3); flips > 0; --flips)
        body[rng() % body.size()] = static_cast<char>(rng());
    v1::PeerRequest sent;
    if (!sent.ParseFromString(body) || !sent.has_tag()) continue;  // a frame the server would not see as a tag
    ASSERT_TRUE(link->Send(sent).ok());
    v1::PeerReply reply;
    ASSERT_TRUE(link->Recv(&reply).ok()) << "iteration " << it;
    accepted += reply.code() == 0;
  }
  EXPECT_GT(accepted, 0);
  for (int32_t node = 0; node < 4; ++node) {
    for (HeldTag& h : store.Tags("job", node)) {
      TagInfo copy = h.tag;
      EXPECT_EQ(TagRegistry::Check(&copy), "") << h.tag.tag;
      EXPECT_GT(h.tag.complete_unix_ns, 0);
      for (const TagFile& f : h.tag.files) EXPECT_EQ(f.path.rfind("/ckpt/f", 0), 0u) << f.path;
    }
  }
  server.Stop();
}

}  // namespace
}  // namespace tce
