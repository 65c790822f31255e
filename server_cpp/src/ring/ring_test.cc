#include <gtest/gtest.h>
#include <sys/socket.h>
#include <unistd.h>

#include <thread>

#include "persist/crc.h"
#include "ring/backup_store.h"
#include "ring/peer_link.h"
#include "tce/v1/tce.pb.h"

namespace tce {
namespace {
using namespace std::chrono_literals;

// Connects a client link to a one-shot acceptor; returns both outcomes.
void Pair(const std::string& client_token, const std::string& server_token, Status* client,
          Status* server, std::unique_ptr<PeerLink>* c, std::unique_ptr<PeerLink>* s) {
  int lfd = -1;
  std::string bound;
  ASSERT_TRUE(ListenTcp("127.0.0.1:0", &lfd, &bound).ok());
  std::thread acceptor([&] {
    int fd = accept(lfd, nullptr, nullptr);
    *server = PeerLink::Accept(fd, "server:1", server_token, 2000ms, s);
  });
  *client = PeerLink::Connect(bound, "client:1", client_token, 2000ms, c);
  acceptor.join();
  close(lfd);
}

TEST(PeerLink, AuthenticatesBothWaysAndCarriesMessages) {
  Status cs, ss;
  std::unique_ptr<PeerLink> c, s;
  Pair("token", "token", &cs, &ss, &c, &s);
  ASSERT_TRUE(cs.ok()) << cs.ToString();
  ASSERT_TRUE(ss.ok()) << ss.ToString();
  EXPECT_EQ(c->peer(), "server:1");
  EXPECT_EQ(s->peer(), "client:1");
  v1::PeerDrop out, in;
  out.set_job("j");
  out.set_path("/p\nq");
  out.set_version(7);
  ASSERT_TRUE(c->Send(out).ok());
  ASSERT_TRUE(s->Recv(&in).ok());
  EXPECT_EQ(in.path(), "/p\nq");
  EXPECT_EQ(in.version(), 7u);
}

TEST(PeerLink, AWrongTokenIsRefusedOnBothSides) {
  Status cs, ss;
  std::unique_ptr<PeerLink> c, s;
  Pair("guess", "token", &cs, &ss, &c, &s);
  EXPECT_EQ(ss.code(), Status::Code::kUnauthenticated);
  EXPECT_NE(ss.message().find("does not know the cluster token"), std::string::npos) << ss.message();
  EXPECT_EQ(cs.code(), Status::Code::kUnauthenticated) << cs.ToString();
  EXPECT_EQ(c, nullptr);
  EXPECT_EQ(s, nullptr);
}

TEST(PeerLink, ConnectingToNobodyFailsQuickly) {
  int lfd = -1;
  std::string bound;
  ASSERT_TRUE(ListenTcp("127.0.0.1:0", &lfd, &bound).ok());
  close(lfd);  // the port is free again: nobody listens
  std::unique_ptr<PeerLink> c;
  Status st = PeerLink::Connect(bound, "me:1", "t", 1000ms, &c);
  EXPECT_EQ(st.code(), Status::Code::kUnavailable) << st.ToString();
  EXPECT_EQ(PeerLink::Connect("nocolon", "me:1", "t", 1000ms, &c).code(), Status::Code::kInvalidArgument);
}

TEST(BackupStore, BudgetRecyclingAndDrop) {
  const uint64_t cap = Cache::CapacityFor(1 << 20);
  BackupStore store(cap * 2);
  std::unique_ptr<MappedBuffer> a, b, c;
  ASSERT_TRUE(store.Reserve("j", "/a", 1 << 20, &a).ok());
  ASSERT_TRUE(store.Reserve("j", "/b", 1 << 20, &b).ok());
  Status full = store.Reserve("j", "/c", 1 << 20, &c);
  EXPECT_EQ(full.code(), Status::Code::kResourceExhausted);
  EXPECT_NE(full.message().find("backup share full"), std::string::npos);
  a->data()[5] = 42;  // the mapping is writable
  HeldBackup h;
  h.file.job = "j";
  h.file.path = "/a";
  h.file.size = 1 << 20;
  h.file.version = 3;
  h.buffer = std::move(a);
  store.Commit(std::move(h));
  store.Abandon(std::move(b));  // back to the free pool
  ASSERT_TRUE(store.Reserve("j", "/c", 1 << 20, &c).ok());  // recycles b: no new memory
  EXPECT_EQ(store.Stats().reused, 1u);
  EXPECT_EQ(store.Stats().used, cap * 2);
  store.Abandon(std::move(c));
  EXPECT_FALSE(store.Drop("j", "/a", 4));  // another version: kept
  EXPECT_TRUE(store.Drop("j", "/a", 3));
  BackupStoreStats st = store.Stats();
  EXPECT_EQ(st.files, 0u);
  EXPECT_EQ(st.used, cap * 2);  // both buffers wait in the pool
  // A copy too large for the pooled buffers: they are destroyed to make room.
  const uint64_t big_size = cap + cap / 2;
  ASSERT_LE(Cache::CapacityFor(big_size), cap * 2);
  std::unique_ptr<MappedBuffer> big;
  ASSERT_TRUE(store.Reserve("j", "/big", big_size, &big).ok());
  EXPECT_EQ(store.Stats().used, Cache::CapacityFor(big_size));
  store.Abandon(std::move(big));
}

TEST(VerifyRecords, NamesTheRecordThatDiffers) {
  std::vector<unsigned char> data(300, 'x');
  std::vector<Record> records = {{"a/data/0", 0, 10, 100, 0, 0}, {"a/data/1", 120, 130, 50, 0, 0}};
  for (Record& r : records) r.crc32 = Crc32(0, data.data() + r.data_offset, r.size);
  EXPECT_TRUE(VerifyRecords(data.data(), data.size(), records).ok());
  data[150] ^= 1;
  Status s = VerifyRecords(data.data(), data.size(), records);
  EXPECT_EQ(s.code(), Status::Code::kInternal);
  EXPECT_NE(s.message().find("checksum mismatch in record a/data/1"), std::string::npos) << s.message();
  records[1].size = 1000;
  EXPECT_EQ(VerifyRecords(data.data(), data.size(), records).code(), Status::Code::kInvalidArgument);
}

}  // namespace
}  // namespace tce

namespace tce {
namespace {

TEST(RecordCrcs, AnyChunkingGivesTheWholeRecordCrcs) {
  std::vector<unsigned char> data(100000);
  for (size_t i = 0; i < data.size(); ++i) data[i] = static_cast<unsigned char>(i * 131 + 7);
  std::vector<Record> records = {{"r0", 0, 64, 0, 0, 0},        // empty
                                 {"r1", 64, 128, 40000, 0, 0},
                                 {"r2", 40200, 40264, 59000, 0, 0}};
  for (size_t chunk : {1u, 7u, 4096u, 65536u, 1000000u}) {
    RecordCrcs crcs(records);
    for (size_t off = 0; off < data.size(); off += chunk)
      crcs.Feed(off, data.data() + off, std::min(chunk, data.size() - off));
    for (size_t i = 0; i < records.size(); ++i)
      EXPECT_EQ(crcs.crcs()[i], Crc32(0, data.data() + records[i].data_offset, records[i].size))
          << "chunk " << chunk << " record " << i;
  }
}

}  // namespace
}  // namespace tce
