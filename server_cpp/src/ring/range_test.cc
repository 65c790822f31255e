// Ranged reads over the ring: the range checks, the peer port's answers to
// PeerReadRange (own file, held copy, refusals) and the RangeReader that
// asks it, against a real PeerServer and a hostile one.
#include <gtest/gtest.h>
#include <sys/socket.h>
#include <unistd.h>

#include <csignal>
#include <limits>
#include <thread>
#include <vector>

#include "cache/cache.h"
#include "persist/crc.h"
#include "ring/peer_server.h"
#include "ring/peer_testing.h"
#include "ring/range_read.h"
#include "ring/range_reader.h"
#include "ring/tcp_transport.h"

namespace tce {
namespace {
using namespace std::chrono_literals;

constexpr uint64_t kSize = 3 * 1024 * 1024 + 123;

std::string Pattern(uint64_t size, int seed) {
  std::string s(size, '\0');
  for (uint64_t i = 0; i < size; ++i) s[i] = static_cast<char>(i * 131 + i / 997 + seed);
  return s;
}

TEST(CheckRange, RefusesEmptyHugePastTheEndAndWrappingRanges) {
  EXPECT_TRUE(CheckRange(0, 10, 10).ok());
  EXPECT_TRUE(CheckRange(9, 1, 10).ok());
  Status s = CheckRange(0, 0, 10);
  EXPECT_EQ(s.code(), Status::Code::kInvalidArgument);
  EXPECT_NE(s.message().find("takes 1 to 16777216 bytes, not 0"), std::string::npos) << s.message();
  EXPECT_EQ(CheckRange(0, kMaxRangeLength + 1, uint64_t{1} << 40).code(), Status::Code::kInvalidArgument);
  s = CheckRange(5, 6, 10);
  EXPECT_EQ(s.code(), Status::Code::kOutOfRange);
  EXPECT_NE(s.message().find("bytes [5, +6) are not inside the file's 10 bytes"), std::string::npos);
  EXPECT_EQ(CheckRange(11, 1, 10).code(), Status::Code::kOutOfRange);
  const uint64_t max = std::numeric_limits<uint64_t>::max();
  EXPECT_EQ(CheckRange(max - 3, 16, max).code(), Status::Code::kOutOfRange);  // offset + length wraps
  EXPECT_EQ(CheckRange(max, 1, 10).code(), Status::Code::kOutOfRange);
}

// A PeerServer whose cache holds /c/own (job "j", ring {server, "127.0.0.1:1"}) and
// whose store holds /c/held, a copy "127.0.0.1:1" sent.
class PeerRangeTest : public ::testing::Test {
 protected:
  void SetUp() override {
    signal(SIGPIPE, SIG_IGN);
    server_ = std::make_unique<PeerServer>(LoopbackPeerOptions(), transport_.get(), &store_, RingStores::Of(&cache_));
    ASSERT_TRUE(server_->Start().ok());
    session_ = cache_.sessions()->OpenSession(getuid(), getpid());
    std::string successor;
    ASSERT_TRUE(cache_.rings()->SetRing(session_, "j", 0, {server_->endpoint(), "127.0.0.1:1"}, &successor).ok());
    own_ = Pattern(kSize, 1);
    AllocateResult a;
    ASSERT_TRUE(cache_.Allocate({session_, "j", "t", "/c/own", 0, kSize}, &a).ok());
    int fd = -1;
    bool writable = false;
    uint64_t cap = 0;
    ASSERT_TRUE(cache_.sessions()->FdFor(session_, a.buffer_id, &fd, &writable, &cap).ok());
    ASSERT_EQ(pwrite(fd, own_.data(), kSize, 0), static_cast<ssize_t>(kSize));
    close(fd);
    FileInfo f;
    ASSERT_TRUE(cache_.Commit(session_, a.allocation_id, {}, &f).ok());
    held_ = Pattern(5000, 2);
    std::unique_ptr<MappedBuffer> buf;
    ASSERT_TRUE(store_.Reserve("j", "/c/held", held_.size(), &buf).ok());
    memcpy(buf->data(), held_.data(), held_.size());
    HeldBackup h;
    h.file.job = "j";
    h.file.path = "/c/held";
    h.file.size = held_.size();
    h.file.version = 9;
    h.owner = "127.0.0.1:1";
    h.job_uid = getuid();
    h.buffer = std::move(buf);
    store_.Commit(std::move(h));
  }
  void TearDown() override { server_->Stop(); }

  std::unique_ptr<PeerLink> Connect(const std::string& self) {
    std::unique_ptr<PeerLink> link;
    Status s = PeerLink::Connect(server_->endpoint(), self, "t", 2000ms, &link);
    EXPECT_TRUE(s.ok()) << s.ToString();
    return link;
  }
  // With `raw`, the bytes that follow an OK reply are read into its `data`
  // (after checking that it announced them and carried none itself).
  // `uid`: the uid the asker says the job belongs to on its node (-1: none).
  v1::PeerRangeReply Ask(PeerLink* link, const std::string& job, const std::string& path,
                         uint64_t offset, uint64_t length, bool raw = false, int64_t uid = getuid()) {
    v1::PeerRequest req;
    if (uid >= 0) req.mutable_read_range()->set_job_uid(static_cast<uint32_t>(uid));
    req.mutable_read_range()->set_job(job);
    req.mutable_read_range()->set_path(path);
    req.mutable_read_range()->set_offset(offset);
    req.mutable_read_range()->set_length(length);
    req.mutable_read_range()->set_raw(raw);
    v1::PeerRangeReply reply;
    EXPECT_TRUE(link->Send(req).ok());
    Status s = link->Recv(&reply);
    EXPECT_TRUE(s.ok()) << s.ToString();
    if (raw && reply.code() == 0) {
      EXPECT_EQ(reply.raw_length(), length);
      EXPECT_TRUE(reply.data().empty());
      reply.mutable_data()->resize(reply.raw_length());
      s = link->RecvAll(&(*reply.mutable_data())[0], reply.raw_length());
      EXPECT_TRUE(s.ok()) << s.ToString();
    } else {
      EXPECT_EQ(reply.raw_length(), 0u);
    }
    return reply;
  }

  Cache cache_{64 << 20};
  BackupStore store_{16 << 20};
  std::unique_ptr<Transport> transport_ = NewTcpTransport(1);
  std::unique_ptr<PeerServer> server_;
  std::string session_, own_, held_;
};

TEST_F(PeerRangeTest, ServesExactlyTheRangeWithItsCrc) {
  std::unique_ptr<PeerLink> link = Connect("127.0.0.1:1");
  v1::PeerRangeReply r = Ask(link.get(), "j", "/c/own", 1000001, 70000);
  ASSERT_EQ(r.code(), 0) << r.message();
  EXPECT_EQ(r.data(), own_.substr(1000001, 70000));
  EXPECT_EQ(r.file_size(), kSize);
  EXPECT_FALSE(r.held());
  EXPECT_EQ(r.crc32(), Crc32(0, reinterpret_cast<const unsigned char*>(r.data().data()), r.data().size()));
  r = Ask(link.get(), "j", "/c/own", kSize - 1, 1);  // the last byte
  ASSERT_EQ(r.code(), 0) << r.message();
  EXPECT_EQ(r.data(), own_.substr(kSize - 1));
  r = Ask(link.get(), "j", "/c/held", 4000, 1000);
  ASSERT_EQ(r.code(), 0) << r.message();
  EXPECT_TRUE(r.held());
  EXPECT_EQ(r.data(), held_.substr(4000));
  EXPECT_EQ(r.version(), 9u);
}

TEST_F(PeerRangeTest, RawReadsSendTheBytesAfterTheReplyAndTheLinkGoesOn) {
  std::unique_ptr<PeerLink> link = Connect("127.0.0.1:1");
  for (int round = 0; round < 2; ++round) {  // in step: the bytes were read exactly
    v1::PeerRangeReply r = Ask(link.get(), "j", "/c/own", 1000001 + round, 2100000, /*raw=*/true);
    ASSERT_EQ(r.code(), 0) << r.message();
    EXPECT_EQ(r.data(), own_.substr(1000001 + round, 2100000));
    EXPECT_EQ(r.file_size(), kSize);
    EXPECT_EQ(r.crc32(), Crc32(0, reinterpret_cast<const unsigned char*>(r.data().data()), r.data().size()));
  }
  v1::PeerRangeReply r = Ask(link.get(), "j", "/c/held", 4000, 1000, /*raw=*/true);
  ASSERT_EQ(r.code(), 0) << r.message();
  EXPECT_TRUE(r.held());
  EXPECT_EQ(r.data(), held_.substr(4000));
  // A refusal carries no bytes: the next request is answered in step.
  r = Ask(link.get(), "j", "/c/own", kSize - 10, 11, /*raw=*/true);
  EXPECT_EQ(r.code(), static_cast<int>(Status::Code::kOutOfRange)) << r.message();
  r = Ask(link.get(), "j", "/c/none", 0, 1, /*raw=*/true);
  EXPECT_EQ(r.code(), static_cast<int>(Status::Code::kNotFound)) << r.message();
  r = Ask(link.get(), "j", "/c/own", 5, 5);  // and a reader that does not ask raw gets `data`
  ASSERT_EQ(r.code(), 0) << r.message();
  EXPECT_EQ(r.data(), own_.substr(5, 5));
}

TEST_F(PeerRangeTest, BadRangesUnknownFilesAndStrangersAreRefusedAndTheLinkGoesOn) {
  std::unique_ptr<PeerLink> link = Connect("127.0.0.1:1");
  const uint64_t max = std::numeric_limits<uint64_t>::max();
  struct Case {
    std::string job, path;
    uint64_t offset, length;
    Status::Code code;
    std::string says;
  } cases[] = {
      {"j", "/c/own", kSize, 1, Status::Code::kOutOfRange, "not inside the file's"},
      {"j", "/c/own", kSize - 10, 11, Status::Code::kOutOfRange, "not inside the file's"},
      {"j", "/c/own", max - 7, 16, Status::Code::kOutOfRange, "not inside the file's"},
      {"j", "/c/held", 0, 5001, Status::Code::kOutOfRange, "5000 bytes"},
      {"j", "/c/own", 0, 0, Status::Code::kInvalidArgument, "takes 1 to"},
      {"j", "/c/own", 0, kMaxRangeLength + 1, Status::Code::kInvalidArgument, "takes 1 to"},
      {"j", "/c/none", 0, 1, Status::Code::kNotFound, "not in this server's memory"},
      {"other", "/c/own", 0, 1, Status::Code::kPermissionDenied, "did not send the copy"},
  };
  for (const Case& c : cases) {
    v1::PeerRangeReply r = Ask(link.get(), c.job, c.path, c.offset, c.length);
    EXPECT_EQ(r.code(), static_cast<int>(c.code)) << c.path << " " << c.offset << " " << r.message();
    EXPECT_NE(r.message().find(c.says), std::string::npos) << r.message();
    EXPECT_TRUE(r.data().empty());
  }
  // A peer that is not a member of the job's ring reads nothing, own file or held copy.
  std::unique_ptr<PeerLink> stranger = Connect("127.0.0.1:3");
  for (const char* path : {"/c/own", "/c/held"}) {
    v1::PeerRangeReply r = Ask(stranger.get(), "j", path, 0, 10);
    EXPECT_EQ(r.code(), static_cast<int>(Status::Code::kPermissionDenied)) << path;
    EXPECT_NE(r.message().find("127.0.0.1:3 is not a member of job j's ring"), std::string::npos) << r.message();
  }
  v1::PeerRangeReply r = Ask(link.get(), "j", "/c/own", 5, 5);  // still in step
  ASSERT_EQ(r.code(), 0) << r.message();
  EXPECT_EQ(r.data(), own_.substr(5, 5));
}

// A job is its name and its uid: a member of the ring whose job of that
// name belongs to another uid (a squatter who set it there first), or that
// names no uid, reads nothing of it.
TEST_F(PeerRangeTest, AMemberActingForAnotherUidsJobReadsNothing) {
  std::unique_ptr<PeerLink> link = Connect("127.0.0.1:1");
  const int64_t other = static_cast<int64_t>(getuid()) + 4242;
  for (const char* path : {"/c/own", "/c/held"}) {
    v1::PeerRangeReply r = Ask(link.get(), "j", path, 0, 10, /*raw=*/true, other);
    EXPECT_EQ(r.code(), static_cast<int>(Status::Code::kPermissionDenied)) << path << " " << r.message();
    EXPECT_NE(r.message().find("as uid " + std::to_string(other)), std::string::npos) << r.message();
    EXPECT_TRUE(r.data().empty());
    r = Ask(link.get(), "j", path, 0, 10, /*raw=*/false, /*uid=*/-1);
    EXPECT_EQ(r.code(), static_cast<int>(Status::Code::kPermissionDenied)) << path << " " << r.message();
    EXPECT_NE(r.message().find("names no uid for job j"), std::string::npos) << r.message();
  }
  v1::PeerRangeReply r = Ask(link.get(), "j", "/c/held", 0, 10, /*raw=*/true);  // the job's own uid: served
  ASSERT_EQ(r.code(), 0) << r.message();
  EXPECT_EQ(r.data(), held_.substr(0, 10));
}

TEST_F(PeerRangeTest, TheRangeReaderReadsFromThePeerOverTheRing) {
  Cache mine(16 << 20);  // the asking node: file-less, in the same ring as "127.0.0.1:1"
  const std::string s = mine.sessions()->OpenSession(getuid(), getpid());
  std::string successor;
  ASSERT_TRUE(mine.rings()->SetRing(s, "j", 1, {server_->endpoint(), "127.0.0.1:1"}, &successor).ok());
  RangeReaderOptions o;
  o.self = "127.0.0.1:1";
  o.key = "t";
  o.io_timeout = 2000ms;
  RangeReader reader(RingStores::Of(&mine), o);
  RangeRead got;
  for (int i = 0; i < 3; ++i) {  // the link is kept and reused
    Status st = reader.Read("j", "/c/own", 2000000 + i, 4096, &got);
    ASSERT_TRUE(st.ok()) << st.ToString();
    EXPECT_EQ(got.data, own_.substr(2000000 + i, 4096));
    EXPECT_EQ(got.source, v1::RANGE_SOURCE_PEER);
    EXPECT_EQ(got.file_size, kSize);
  }
  std::string into(70000, '\0');  // where the caller says (a session's range buffer)
  Status st = reader.Read("j", "/c/own", 1000001, 70000, &got,
                          reinterpret_cast<unsigned char*>(&into[0]));
  ASSERT_TRUE(st.ok()) << st.ToString();
  EXPECT_EQ(into, own_.substr(1000001, 70000));
  EXPECT_TRUE(got.data.empty());
  EXPECT_EQ(reader.peer_reads(), 4u);
  EXPECT_EQ(reader.peer_bytes(), 3u * 4096 + 70000);  // the ranges, not the file
  EXPECT_EQ(reader.Read("j", "/c/own", kSize, 1, &got).code(), Status::Code::kOutOfRange);
  EXPECT_EQ(reader.Read("j", "/c/none", 0, 1, &got).code(), Status::Code::kNotFound);
  // A job whose ring this node was never told asks nobody.
  EXPECT_EQ(reader.Read("k", "/c/own", 0, 1, &got).code(), Status::Code::kNotFound);
  // The copy the peer holds is read the same way.
  st = reader.Read("j", "/c/held", 0, 5000, &got);
  ASSERT_TRUE(st.ok()) << st.ToString();
  EXPECT_EQ(got.data, held_);
  // A peer that went away: NOT_FOUND (the caller reads storage), saying why.
  server_->Stop();
  st = reader.Read("j", "/c/own", 0, 1, &got);
  EXPECT_EQ(st.code(), Status::Code::kNotFound);
  EXPECT_NE(st.message().find("could not be read from the ring"), std::string::npos) << st.message();
}

TEST_F(PeerRangeTest, OnlyAReadThatAsksAPeerIsAdmittedAndARefusalIsItsAnswer) {
  Cache mine(16 << 20);
  const std::string s = mine.sessions()->OpenSession(getuid(), getpid());
  std::string successor;
  ASSERT_TRUE(mine.rings()->SetRing(s, "j", 1, {server_->endpoint(), "127.0.0.1:1"}, &successor).ok());
  RangeReaderOptions o;
  o.self = "127.0.0.1:1";
  o.key = "t";
  o.io_timeout = 2000ms;
  RangeReader reader(RingStores::Of(&mine), o);
  int asked = 0;
  PeerWait refuse;
  refuse.admit = [&] {
    ++asked;
    return Status::ResourceExhausted("max_peer_calls reached");
  };
  RangeRead got;
  Status st = reader.Read("j", "/c/own", 0, 10, &got, nullptr, refuse);
  EXPECT_EQ(st.code(), Status::Code::kResourceExhausted) << st.ToString();
  EXPECT_EQ(asked, 1);
  EXPECT_EQ(reader.peer_reads(), 0u);  // no peer was asked
  // A job with no ring here asks no peer, so nothing is asked of the caller either.
  EXPECT_EQ(reader.Read("k", "/c/own", 0, 10, &got, nullptr, refuse).code(), Status::Code::kNotFound);
  EXPECT_EQ(asked, 1);
  // Admitted, the read goes on, within its deadline.
  PeerWait admitted;
  admitted.admit = [&] {
    ++asked;
    return Status::OK();
  };
  admitted.deadline = std::chrono::steady_clock::now() + 60s;
  st = reader.Read("j", "/c/own", 0, 10, &got, nullptr, admitted);
  ASSERT_TRUE(st.ok()) << st.ToString();
  EXPECT_EQ(got.data, own_.substr(0, 10));
  EXPECT_EQ(asked, 2);
}

// What a hostile peer answers one ranged read with: a reply, then raw bytes.
struct Answer {
  v1::PeerRangeReply reply;
  std::string raw;
};

// A peer that authenticates once, then answers ranged reads on that one
// connection with `answers`, in order, and closes it.
void HostilePeer(int lfd, const std::string& bound, std::vector<Answer> answers) {
  int fd = accept(lfd, nullptr, nullptr);
  std::unique_ptr<PeerLink> link;
  if (!PeerLink::Accept(fd, bound, "t", 2000ms, &link).ok()) return;
  for (const Answer& a : answers) {
    v1::PeerRequest req;
    if (!link->Recv(&req).ok() || !link->Send(a.reply).ok()) return;
    if (!a.raw.empty() && !link->SendAll(a.raw.data(), a.raw.size()).ok()) return;
  }
}

// A RangeReader of a file-less node in ring {"127.0.0.1:1", peer}.
struct Asker {
  explicit Asker(const std::string& peer) : cache(16 << 20) {
    const std::string s = cache.sessions()->OpenSession(getuid(), getpid());
    std::string successor;
    EXPECT_TRUE(cache.rings()->SetRing(s, "j", 0, {"127.0.0.1:1", peer}, &successor).ok());
    RangeReaderOptions o;
    o.self = "127.0.0.1:1";
    o.key = "t";
    o.io_timeout = 2000ms;
    reader = std::make_unique<RangeReader>(RingStores::Of(&cache), o);
  }
  Cache cache;
  std::unique_ptr<RangeReader> reader;
};

TEST(RangeReader, APeersBytesAreCheckedBeforeUse) {
  signal(SIGPIPE, SIG_IGN);
  const std::string data(100, 'x');
  v1::PeerRangeReply bad_crc, short_data, small_file, error;
  bad_crc.set_data(data);
  bad_crc.set_file_size(1000);
  bad_crc.set_crc32(Crc32(0, reinterpret_cast<const unsigned char*>(data.data()), data.size()) ^ 1);
  short_data = bad_crc;
  short_data.set_data(data.substr(1));
  short_data.set_crc32(Crc32(0, reinterpret_cast<const unsigned char*>(data.data()), 99));
  small_file = bad_crc;
  small_file.set_crc32(Crc32(0, reinterpret_cast<const unsigned char*>(data.data()), 100));
  small_file.set_file_size(50);
  error.set_code(13);
  error.set_message(std::string(5000, 'e'));
  struct Case {
    v1::PeerRangeReply reply;
    Status::Code code;
    std::string says;
  } cases[] = {{bad_crc, Status::Code::kDataLoss, "do not match their CRC-32"},
               {short_data, Status::Code::kDataLoss, "sent 99 bytes for a range of 100"},
               {small_file, Status::Code::kDataLoss, "too few for the range it sent"},
               {error, Status::Code::kNotFound, "eee"}};
  for (const Case& c : cases) {
    int lfd = -1;
    std::string bound;
    ASSERT_TRUE(ListenTcp("127.0.0.1:0", &lfd, &bound).ok());
    std::thread peer(HostilePeer, lfd, bound, std::vector<Answer>{{c.reply, ""}});
    Asker mine(bound);
    RangeRead got;
    Status st = mine.reader->Read("j", "/c/f", 0, 100, &got);
    peer.join();
    close(lfd);
    EXPECT_EQ(st.code(), c.code) << st.ToString();
    EXPECT_NE(st.message().find(c.says), std::string::npos) << st.message();
    EXPECT_LE(st.message().size(), 1200u);  // a peer's message is cut short
    EXPECT_TRUE(got.data.empty());
    EXPECT_EQ(mine.reader->peer_reads(), 0u);
  }
}

// The raw data path: bytes that follow the reply are checked as those inside
// it are. A peer whose bytes fail their CRC-32 stays in step (every announced
// byte was read) and its link is used again; one that announces another
// length, or sends fewer bytes than it announced, loses its link.
TEST(RangeReader, RawBytesAreCheckedBeforeUseAndABadPeerLosesOnlyItsLink) {
  signal(SIGPIPE, SIG_IGN);
  const std::string data(100, 'x');
  const uint32_t crc = Crc32(0, reinterpret_cast<const unsigned char*>(data.data()), data.size());
  v1::PeerRangeReply good;
  good.set_file_size(1000);
  good.set_crc32(crc);
  good.set_raw_length(100);
  v1::PeerRangeReply bad_crc = good, small_file = good, too_long = good, both = good;
  bad_crc.set_crc32(crc ^ 1);
  small_file.set_file_size(50);
  too_long.set_raw_length(200);
  both.set_data(data);
  struct Case {
    std::vector<Answer> answers;  // on one connection
    Status::Code code;
    std::string says;
    bool reused;  // the second read is answered on the same connection
  } cases[] = {
      {{{bad_crc, data}, {good, data}}, Status::Code::kDataLoss, "do not match their CRC-32", true},
      {{{small_file, data}, {good, data}}, Status::Code::kDataLoss, "too few for the range", true},
      {{{too_long, data + data}}, Status::Code::kDataLoss, "announced 200 raw bytes", false},
      {{{both, data}}, Status::Code::kDataLoss, "and 100 in the reply", false},
      {{{good, data.substr(0, 60)}}, Status::Code::kDataLoss, "sent less than the 100 bytes", false},
  };
  for (const Case& c : cases) {
    int lfd = -1;
    std::string bound;
    ASSERT_TRUE(ListenTcp("127.0.0.1:0", &lfd, &bound).ok());
    std::thread peer(HostilePeer, lfd, bound, c.answers);
    Asker mine(bound);
    RangeRead got;
    Status st = mine.reader->Read("j", "/c/f", 0, 100, &got);
    EXPECT_EQ(st.code(), c.code) << st.ToString();
    EXPECT_NE(st.message().find(c.says), std::string::npos) << st.message();
    EXPECT_TRUE(got.data.empty());
    if (c.reused) {  // the same connection answers the next read, good bytes this time
      st = mine.reader->Read("j", "/c/f", 0, 100, &got);
      ASSERT_TRUE(st.ok()) << st.ToString();
      EXPECT_EQ(got.data, data);
      EXPECT_EQ(mine.reader->peer_reads(), 1u);
    } else {  // the link was dropped: the next read must dial again, and finds no one
      peer.join();
      close(lfd);
      lfd = -1;
      st = mine.reader->Read("j", "/c/f", 0, 100, &got);
      EXPECT_EQ(st.code(), Status::Code::kNotFound) << st.ToString();
      EXPECT_NE(st.message().find("connect"), std::string::npos) << st.message();
      EXPECT_EQ(mine.reader->peer_reads(), 0u);
    }
    if (peer.joinable()) peer.join();
    if (lfd >= 0) close(lfd);
  }
}

}  // namespace
}  // namespace tce
