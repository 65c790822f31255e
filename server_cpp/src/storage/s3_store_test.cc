// S3Store's restart: which unfinished multipart uploads a crashed run left
// (its journal, storage/s3_journal.h), against a loopback server that lists
// uploads as S3 does; the store's time is a ManualClock's.
#include "storage/s3_store.h"

#include <gtest/gtest.h>

#include <fstream>
#include <set>
#include <sstream>

#include "common/manual_clock.h"
#include "common/mutex.h"
#include "common/testing.h"
#include "storage/s3_test_server.h"

namespace tce {
namespace {

constexpr int64_t kT = 1700000000;  // the ManualClock's wall time at its start: 2023-11-14T22:13:20Z

struct Upload {
  std::string key, id, initiated;
};

// Lists `uploads` (whatever the prefix asks: the store must check keys
// itself), aborts any, and answers HEAD with a Date of the clock's time.
class FakeUploads {
 public:
  explicit FakeUploads(std::vector<Upload> uploads) : uploads_(std::move(uploads)) {}
  Answer operator()(const SeenRequest& r) EXCLUDES(mu_) {
    MutexLock l(&mu_);
    if (r.method == "HEAD") {
      Answer a;
      a.status = 404;
      a.headers = {{"Date", "Tue, 14 Nov 2023 22:13:20 GMT"}};
      return a;
    }
    if (r.method == "GET" && r.query.find("uploads") != std::string::npos) {
      std::string body = "<ListMultipartUploadsResult>";
      for (const Upload& u : uploads_)
        body += "<Upload><Key>" + u.key + "</Key><UploadId>" + u.id + "</UploadId><Initiated>" + u.initiated +
                "</Initiated></Upload>";
      return Answer::Xml(200, body + "<IsTruncated>false</IsTruncated></ListMultipartUploadsResult>");
    }
    if (r.method == "DELETE") {
      aborted_.insert(r.query.substr(r.query.find("uploadId=") + 9));
      Answer a;
      a.status = 204;
      return a;
    }
    return Answer::Error(400, "Unexpected");
  }
  std::set<std::string> aborted() EXCLUDES(mu_) {
    MutexLock l(&mu_);
    return aborted_;
  }

 private:
  Mutex mu_;
  const std::vector<Upload> uploads_;
  std::set<std::string> aborted_ GUARDED_BY(mu_);
};

struct Fixture {
  explicit Fixture(std::vector<Upload> uploads)
      : fake(std::make_shared<FakeUploads>(std::move(uploads))),
        server([f = fake](const SeenRequest& r) { return (*f)(r); }),
        dir(MakeTempDir("s3store")) {}
  std::unique_ptr<S3Store> Store() {
    S3Config c;
    c.endpoint = server.endpoint();
    c.path_style = true;
    c.credentials = {"AKIDEXAMPLE", "SECRETEXAMPLEKEY", ""};
    c.backoff = c.max_backoff = std::chrono::milliseconds(1);
    c.clock = &clock;
    S3StoreOptions o;
    o.journal = dir + "/uploads.journal";
    o.request_timeout_ms = 120000;
    return std::make_unique<S3Store>("b", o, std::make_unique<S3Client>(c));
  }
  void WriteJournal(const std::string& text) { std::ofstream(dir + "/uploads.journal") << text; }
  std::string ReadJournal() {
    std::ifstream in(dir + "/uploads.journal");
    std::stringstream ss;
    ss << in.rdbuf();
    return ss.str();
  }
  ManualClock clock;
  std::shared_ptr<FakeUploads> fake;
  TestHttpServer server;
  std::string dir;
};

TEST(S3StoreRestart, AbortsTheUploadsWhoseCreationWasNeverAnsweredAndNoOneElses) {
  Fixture f({
      {"run1/k.pt", "mine", "2023-11-14T22:13:21.000Z"},           // a second after the creation was journaled
      {"run1/k.pt", "earlier", "2023-11-14T22:13:10.000Z"},        // before it: another writer's
      {"run1/k.pt", "later", "2023-11-14T22:15:30.000Z"},          // past the request's deadline
      {"run1/k.pt.other", "prefix", "2023-11-14T22:13:21.000Z"},   // another key the prefix lists too
      {"run1/k.pt", "unreadable", "yesterday"},                    // no time to tell by
      {"run1/j.pt", "journaled", "2023-11-14T22:00:00.000Z"},      // its id journaled: aborted by it
      {"run1/n.pt", "answered", "2023-11-14T22:13:21.000Z"},       // its creation answered
  });
  ASSERT_TRUE(f.server.ok());
  f.WriteJournal("? tok1 1700000000 5 run1/k.pt\n"
                 "+ journaled run1/j.pt\n"
                 "? tok2 1700000000 5 run1/n.pt\n"
                 "+ answered run1/n.pt\n= tok2\n- answered\n"
                 "? tok3 17000");  // a line a crash cut off
  auto store = f.Store();
  ObjectId id;
  ASSERT_TRUE(store->Stat("run1/x", &id).ok());  // an answer with a Date: the store's time is known
  f.clock.Advance(std::chrono::seconds(60));       // the restart, a minute after the crash
  EXPECT_EQ(store->AbandonUnfinished(), 2);
  EXPECT_EQ(f.fake->aborted(), (std::set<std::string>{"mine", "journaled"}));
  EXPECT_EQ(f.ReadJournal(), "");  // nothing left for the next start
}

TEST(S3StoreRestart, AnUploadBegunAfterTheRestartIsNotTheCrashedRuns) {
  // The creation was journaled a second before this start: an upload of
  // the key that S3 initiated later than now is another (or this) run's.
  Fixture f({{"run1/k.pt", "now", "2023-11-14T22:13:21.000Z"}, {"run1/k.pt", "after", "2023-11-14T22:13:40.000Z"}});
  ASSERT_TRUE(f.server.ok());
  f.WriteJournal("? tok1 1699999999 5 run1/k.pt\n");
  auto store = f.Store();
  ObjectId id;
  ASSERT_TRUE(store->Stat("run1/x", &id).ok());
  EXPECT_EQ(store->AbandonUnfinished(), 1);
  EXPECT_EQ(f.fake->aborted(), (std::set<std::string>{"now"}));
}

TEST(UploadJournal, ARewriteKeepsWhatWasJournaledAfterTheRead) {
  const std::string dir = MakeTempDir("s3journal");
  UploadJournal journal(dir + "/j");
  const std::string token = journal.Creating("run1/a b.pt", kT, 5);
  journal.Created(token, "id-1", "run1/a b.pt");
  UploadJournal::Open open;
  ASSERT_TRUE(journal.Read(&open));
  EXPECT_EQ(open.uploads, (std::map<std::string, std::string>{{"id-1", "run1/a b.pt"}}));
  EXPECT_TRUE(open.creations.empty());
  const std::string later = journal.Creating("run1/c.pt", kT + 1, 900);  // meanwhile, by the new run
  journal.Rewrite(open, "");
  ASSERT_TRUE(journal.Read(&open));
  EXPECT_TRUE(open.uploads.empty());
  ASSERT_EQ(open.creations.size(), 1u);
  EXPECT_EQ(open.creations[0].token, later);
  EXPECT_EQ(open.creations[0].key, "run1/c.pt");
  EXPECT_EQ(open.creations[0].at_s, kT + 1);
  EXPECT_EQ(open.creations[0].slack_s, 900);
  EXPECT_TRUE(journal.CreatedHere("id-1"));
  EXPECT_FALSE(journal.CreatedHere("id-2"));
}

}  // namespace
}  // namespace tce
