// PutObject against a loopback server that keeps one bucket's multipart
// upload the way S3 does.
#include <openssl/evp.h>

#include <gtest/gtest.h>

#include <future>
#include <map>
#include <memory>
#include <set>

#include "common/mutex.h"
#include "storage/s3_client.h"
#include "storage/s3_test_server.h"
#include "storage/s3_xml.h"

namespace tce {
namespace {

using Code = Status::Code;

std::string Md5Hex(const std::string& data) {
  unsigned char md[16];
  unsigned int len = 0;
  EVP_Digest(data.data(), data.size(), md, &len, EVP_md5(), nullptr);
  static const char kDigits[] = "0123456789abcdef";
  std::string out;
  for (unsigned i = 0; i < len; ++i) {
    out += kDigits[md[i] >> 4];
    out += kDigits[md[i] & 15];
  }
  return out;
}

std::string Unhex(const std::string& hex) {
  std::string out;
  for (size_t i = 0; i + 1 < hex.size(); i += 2) out += static_cast<char>(std::stoi(hex.substr(i, 2), nullptr, 16));
  return out;
}

// One bucket as S3 keeps it: objects, and uploads with their parts.
// Handlers run one at a time; tests read it once the calls are done.
struct FakeBucket {
  std::map<std::string, std::string> objects;
  std::map<int, std::string> parts;  // of the one upload, "up-1"
  bool upload_open = false;
  std::set<int> failing_parts;       // answered 400 every time
  std::set<int> slow_down_once;      // answered 503 SlowDown the first time
  bool hang_parts = false;
  bool drop_first_complete = false;  // completes, then drops the reply
  int completes = 0, aborts = 0;

  Answer operator()(const SeenRequest& r) {
    const std::string key = r.path.substr(3);  // after "/b/"
    Answer a;
    if (r.method == "POST" && r.query == "uploads=") {
      upload_open = true;
      return Answer::Xml(200, "<InitiateMultipartUploadResult><UploadId>up-1</UploadId>"
                              "</InitiateMultipartUploadResult>");
    }
    if (r.method == "PUT" && r.query.empty()) {
      objects[key] = r.body;
      a.headers.emplace_back("ETag", "\"" + Md5Hex(r.body) + "\"");
      return a;
    }
    if (r.method == "PUT") {
      const int part = std::stoi(r.query.substr(r.query.find("partNumber=") + 11));
      if (hang_parts) a.hang = true;
      if (failing_parts.count(part)) return Answer::Error(400, "InvalidRequest", "part refused");
      if (slow_down_once.erase(part)) return Answer::Error(503, "SlowDown");
      if (!upload_open) return Answer::Error(404, "NoSuchUpload");
      parts[part] = r.body;
      a.headers.emplace_back("ETag", "\"" + Md5Hex(r.body) + "\"");
      return a;
    }
    if (r.method == "POST") {
      if (!upload_open) return Answer::Error(404, "NoSuchUpload");
      std::vector<std::string_view> listed;
      std::string object, md5s, number, etag;
      if (!XmlElements(r.body, "Part", 10000, &listed)) return Answer::Error(400, "MalformedXML");
      for (size_t i = 0; i < listed.size(); ++i) {
        if (!XmlField(listed[i], "PartNumber", &number) || !XmlField(listed[i], "ETag", &etag) ||
            number != std::to_string(i + 1) || etag != "\"" + Md5Hex(parts[i + 1]) + "\"") {
          return Answer::Error(400, "InvalidPart");
        }
        object += parts[i + 1];
        md5s += Unhex(Md5Hex(parts[i + 1]));
      }
      objects[key] = object;
      upload_open = false;
      const std::string final_etag = Md5Hex(md5s) + "-" + std::to_string(listed.size());
      etags[key] = final_etag;
      a = Answer::Xml(200, "<CompleteMultipartUploadResult><ETag>&quot;" + final_etag +
                               "&quot;</ETag></CompleteMultipartUploadResult>");
      a.drop = drop_first_complete && completes == 0;
      ++completes;
      return a;
    }
    if (r.method == "DELETE") {
      ++aborts;
      if (!upload_open) return Answer::Error(404, "NoSuchUpload");
      upload_open = false;
      a.status = 204;
      return a;
    }
    if (r.method == "HEAD") {
      if (!objects.count(key)) return Answer::Xml(404, "");
      const std::string etag_value = etags.count(key) ? etags[key] : Md5Hex(objects[key]);
      a.headers = {{"Content-Length", std::to_string(objects[key].size())}, {"ETag", "\"" + etag_value + "\""}};
      return a;
    }
    return Answer::Error(400, "Unexpected");
  }

  std::map<std::string, std::string> etags;  // of objects completed from parts
};

struct Fixture {
  Fixture() : bucket(std::make_shared<FakeBucket>()), server([b = bucket](const SeenRequest& r) { return (*b)(r); }) {}
  S3Config Config() const {
    S3Config config;
    config.endpoint = server.endpoint();
    config.path_style = true;
    config.credentials = {"AKIDEXAMPLE", "SECRETEXAMPLEKEY", ""};
    config.backoff = std::chrono::milliseconds(1);
    config.max_backoff = std::chrono::milliseconds(2);
    return config;
  }
  std::shared_ptr<FakeBucket> bucket;
  TestHttpServer server;
};

std::string Data(size_t n) {
  std::string data(n, '\0');
  for (size_t i = 0; i < n; ++i) data[i] = static_cast<char>('a' + (i * 7 + i / 13) % 26);
  return data;
}

// What the journal was told, in order.
struct Journal {
  void Record(const std::string& id, bool started) {
    MutexLock lock(&mu);
    calls.push_back(id + (started ? "+" : "-"));
  }
  std::vector<std::string> Calls() {
    MutexLock lock(&mu);
    return calls;
  }
  Mutex mu;
  std::vector<std::string> calls GUARDED_BY(mu);
};

S3PutOptions Options(Journal* journal) {
  S3PutOptions options;
  options.part_size = 1000;
  options.parallel = 3;
  options.journal = [journal](UploadEvent event, const std::string& id) {
    if (event == UploadEvent::kCreating) {
      journal->Record("?", true);  // before any request of the upload
    } else {
      journal->Record(id, event == UploadEvent::kCreated);
    }
  };
  return options;
}

TEST(S3PutObject, SmallObjectIsOnePut) {
  Fixture f;
  ASSERT_TRUE(f.server.ok());
  S3Client client(f.Config());
  Journal journal;
  S3PutOptions options = Options(&journal);
  size_t requests_at_commit = 99;
  options.before_commit = [&] {
    requests_at_commit = f.server.request_count();
    return Status::OK();
  };
  const std::string data = Data(1000);
  std::string etag;
  ASSERT_TRUE(PutObject(&client, "b", "k", data.data(), data.size(), options, &etag).ok());
  EXPECT_EQ(etag, Md5Hex(data));
  EXPECT_EQ(requests_at_commit, 0u);
  EXPECT_EQ(f.server.request_count(), 1u);
  EXPECT_EQ(f.bucket->objects["k"], data);
  EXPECT_TRUE(journal.Calls().empty());
}

TEST(S3PutObject, MultipartSendsEveryPartAndCompletesInOrder) {
  Fixture f;
  ASSERT_TRUE(f.server.ok());
  S3Client client(f.Config());
  Journal journal;
  S3PutOptions options = Options(&journal);
  size_t parts_at_commit = 0;
  options.before_commit = [&] {
    parts_at_commit = f.server.request_count() - 1;
    return Status::OK();
  };
  f.bucket->slow_down_once = {2};
  const std::string data = Data(4500);
  std::string etag;
  ASSERT_TRUE(PutObject(&client, "b", "k", data.data(), data.size(), options, &etag).ok());
  EXPECT_EQ(f.bucket->objects["k"], data);
  EXPECT_EQ(etag, f.bucket->etags["k"]);
  EXPECT_EQ(parts_at_commit, 6u);  // five parts, one of them twice
  EXPECT_EQ(client.retries_made(), 1u);
  std::set<std::string> part_queries;
  for (const SeenRequest& r : f.server.requests()) {
    if (r.method == "PUT") part_queries.insert(r.query);
  }
  EXPECT_EQ(part_queries, (std::set<std::string>{"partNumber=1&uploadId=up-1", "partNumber=2&uploadId=up-1",
                                                 "partNumber=3&uploadId=up-1", "partNumber=4&uploadId=up-1",
                                                 "partNumber=5&uploadId=up-1"}));
  for (int part = 1; part <= 5; ++part) {
    EXPECT_EQ(f.bucket->parts[part], data.substr((part - 1) * 1000, 1000)) << part;
  }
  EXPECT_EQ(f.bucket->completes, 1);
  EXPECT_EQ(f.bucket->aborts, 0);
  EXPECT_EQ(journal.Calls(), (std::vector<std::string>{"?+", "up-1+", "up-1-"}));
}

TEST(S3PutObject, PartFailingPermanentlyAbortsTheUpload) {
  Fixture f;
  ASSERT_TRUE(f.server.ok());
  S3Client client(f.Config());
  Journal journal;
  f.bucket->failing_parts = {3};
  const std::string data = Data(4500);
  std::string etag;
  const Status s = PutObject(&client, "b", "k", data.data(), data.size(), Options(&journal), &etag);
  EXPECT_EQ(s.code(), Code::kInvalidArgument) << s.ToString();
  EXPECT_NE(s.message().find("part refused"), std::string::npos) << s.message();
  EXPECT_EQ(f.bucket->completes, 0);
  EXPECT_EQ(f.bucket->aborts, 1);
  EXPECT_EQ(f.server.requests().back().method, "DELETE");
  EXPECT_EQ(f.server.requests().back().query, "uploadId=up-1");
  EXPECT_FALSE(f.bucket->objects.count("k"));
  EXPECT_EQ(journal.Calls(), (std::vector<std::string>{"?+", "up-1+", "up-1-"}));
}

TEST(S3PutObject, FailedLastCheckAbortsAndIsReturned) {
  Fixture f;
  ASSERT_TRUE(f.server.ok());
  S3Client client(f.Config());
  Journal journal;
  S3PutOptions options = Options(&journal);
  options.before_commit = [] { return Status::Aborted("checkpoint deleted meanwhile"); };
  const std::string data = Data(2500);
  std::string etag;
  const Status s = PutObject(&client, "b", "k", data.data(), data.size(), options, &etag);
  EXPECT_EQ(s.code(), Code::kAborted);
  EXPECT_EQ(s.message(), "checkpoint deleted meanwhile");
  EXPECT_EQ(f.bucket->completes, 0);
  EXPECT_EQ(f.bucket->aborts, 1);
  EXPECT_FALSE(f.bucket->objects.count("k"));
  EXPECT_EQ(journal.Calls(), (std::vector<std::string>{"?+", "up-1+", "up-1-"}));

  const Status single = PutObject(&client, "b", "k", data.data(), 10, options, &etag);
  EXPECT_EQ(single.code(), Code::kAborted);
  EXPECT_FALSE(f.bucket->objects.count("k"));
}

TEST(S3PutObject, CancelEndsTheUploadLeavingItJournaled) {
  Fixture f;
  ASSERT_TRUE(f.server.ok());
  S3Config config = f.Config();
  config.stall_timeout = std::chrono::minutes(10);
  S3Client client(config);
  Journal journal;
  f.bucket->hang_parts = true;
  const std::string data = Data(4500);
  std::string etag;
  auto put = std::async(std::launch::async, [&] {
    return PutObject(&client, "b", "k", data.data(), data.size(), Options(&journal), &etag);
  });
  ASSERT_TRUE(f.server.WaitForRequests(4));  // the create and three parts in flight
  client.Cancel();
  ASSERT_EQ(put.wait_for(std::chrono::seconds(60)), std::future_status::ready);  // a bound against hangs only
  EXPECT_EQ(put.get().code(), Code::kCancelled);
  EXPECT_EQ(f.bucket->completes, 0);
  EXPECT_FALSE(f.bucket->objects.count("k"));
  EXPECT_EQ(journal.Calls(), (std::vector<std::string>{"?+", "up-1+"}));  // for the caller to abort later
}

TEST(S3PutObject, LostCompleteReplyIsRecognisedByTheObjectsEtag) {
  Fixture f;
  ASSERT_TRUE(f.server.ok());
  S3Client client(f.Config());
  Journal journal;
  f.bucket->drop_first_complete = true;
  const std::string data = Data(3000);
  std::string etag;
  const Status s = PutObject(&client, "b", "k", data.data(), data.size(), Options(&journal), &etag);
  ASSERT_TRUE(s.ok()) << s.ToString();
  EXPECT_EQ(etag, f.bucket->etags["k"]);
  EXPECT_EQ(f.bucket->objects["k"], data);
  // The request sent again (by curl or the client) found the upload gone,
  // then HEAD the object with the ETag its parts make.
  EXPECT_EQ(f.bucket->completes, 1);
  EXPECT_EQ(f.server.requests().back().method, "HEAD");
  EXPECT_EQ(f.bucket->aborts, 0);
}

}  // namespace
TEST(S3PutObject, AFileOverTenThousandPartsGetsLargerParts) {
  constexpr uint64_t MiB = 1 << 20;
  EXPECT_EQ(S3PartSize(100 * MiB, 8 * MiB), 8 * MiB);
  EXPECT_EQ(S3PartSize(5000, 1000), 1000u);  // small parts stay small
  EXPECT_EQ(S3PartSize(10000 * 8 * MiB, 8 * MiB), 8 * MiB);   // exactly 10000 parts
  EXPECT_EQ(S3PartSize(10000 * 8 * MiB + 1, 8 * MiB), 9 * MiB);
  const uint64_t n = uint64_t{200} << 30;  // 200 GiB
  const uint64_t part = S3PartSize(n, 8 * MiB);
  EXPECT_LE((n - 1) / part + 1, 10000u);
  EXPECT_EQ(part % MiB, 0u);
}

}  // namespace tce
