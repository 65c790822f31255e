// S3Client against loopback servers that misbehave on purpose: retries,
// error mapping, cancellation, hostile responses, listings.
#include "storage/s3_client.h"

#include <gtest/gtest.h>

#include <cstring>
#include <future>

#include "common/manual_clock.h"
#include "common/testing.h"
#include "storage/s3_test_server.h"

namespace tce {
namespace {

using Code = Status::Code;

S3Config Config(const TestHttpServer& server) {
  S3Config config;
  config.endpoint = server.endpoint();
  config.path_style = true;
  config.credentials = {"AKIDEXAMPLE", "SECRETEXAMPLEKEY", ""};
  config.backoff = std::chrono::milliseconds(1);
  config.max_backoff = std::chrono::milliseconds(2);
  return config;
}

Answer HeadOk() {
  Answer a;
  a.headers = {{"Content-Length", "42"}, {"ETag", "\"abc\""}};
  return a;
}

// An answer for requests of which `n` came before (0 for the first).
using Script = std::function<Answer(int n, const SeenRequest& r)>;
TestHttpServer::Handler Scripted(Script script) {
  auto count = std::make_shared<int>(0);
  return [count, script](const SeenRequest& r) { return script((*count)++, r); };
}

TEST(S3Client, RetriesSlowDownThenSucceeds) {
  TestHttpServer server(Scripted([](int n, const SeenRequest&) {
    return n < 2 ? Answer::Error(503, "SlowDown", "Reduce your request rate.") : HeadOk();
  }));
  ASSERT_TRUE(server.ok());
  S3Client client(Config(server));
  S3Object obj;
  ASSERT_TRUE(client.Head("b", "k", &obj).ok());
  EXPECT_TRUE(obj.exists);
  EXPECT_EQ(obj.size, 42u);
  EXPECT_EQ(obj.etag, "abc");
  EXPECT_EQ(client.retries_made(), 2u);
  EXPECT_EQ(server.request_count(), 3u);
}

TEST(S3Client, GivesUpAfterItsRetriesNamingTheLastFailure) {
  TestHttpServer server([](const SeenRequest&) { return Answer::Error(503, "SlowDown", "Reduce your request rate."); });
  ASSERT_TRUE(server.ok());
  S3Config config = Config(server);
  config.retries = 3;
  S3Client client(config);
  std::vector<S3Listed> listed;
  const Status s = client.List("b", "p", &listed);
  EXPECT_EQ(s.code(), Code::kUnavailable) << s.ToString();
  EXPECT_NE(s.message().find("HTTP 503 SlowDown: Reduce your request rate."), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("after 3 retries"), std::string::npos) << s.message();
  EXPECT_EQ(server.request_count(), 4u);
  EXPECT_EQ(client.retries_made(), 3u);
}

TEST(S3Client, RetriesAnErrorInsideA200Complete) {
  TestHttpServer server(Scripted([](int n, const SeenRequest&) {
    if (n == 0) return Answer::Xml(200, "\n  \n<Error><Code>InternalError</Code><Message>oops</Message></Error>");
    return Answer::Xml(200, "<CompleteMultipartUploadResult><ETag>&quot;e-1&quot;</ETag>"
                            "</CompleteMultipartUploadResult>");
  }));
  ASSERT_TRUE(server.ok());
  S3Client client(Config(server));
  std::string etag;
  ASSERT_TRUE(client.CompleteMultipart("b", "k", "up", {"\"p1\""}, &etag).ok());
  EXPECT_EQ(etag, "e-1");
  EXPECT_EQ(client.retries_made(), 1u);
  EXPECT_EQ(server.requests().at(1).body,
            "<CompleteMultipartUpload xmlns=\"http://s3.amazonaws.com/doc/2006-03-01/\"><Part><PartNumber>1"
            "</PartNumber><ETag>\"p1\"</ETag></Part></CompleteMultipartUpload>");
}

TEST(S3Client, RetriesRetryableCodesWhateverTheStatus) {
  TestHttpServer server(Scripted([](int n, const SeenRequest&) {
    if (n == 0) return Answer::Error(400, "RequestTimeout");
    if (n == 1) return Answer::Error(429, "TooManyRequests");
    if (n == 2) return Answer::Error(500, "Whatever");
    Answer a;
    a.status = 204;
    return a;
  }));
  ASSERT_TRUE(server.ok());
  S3Client client(Config(server));
  ASSERT_TRUE(client.Delete("b", "k").ok());
  EXPECT_EQ(client.retries_made(), 3u);
}

TEST(S3Client, MapsS3ErrorsToStatusCodes) {
  TestHttpServer server([](const SeenRequest& r) {
    const std::string key = r.path.substr(3);  // after "/b/"
    if (key == "missing") return r.method == "HEAD" ? Answer::Xml(404, "") : Answer::Error(404, "NoSuchKey");
    if (key == "denied") return Answer::Error(403, "AccessDenied", "Access Denied");
    if (key == "replaced") return Answer::Error(412, "PreconditionFailed");
    if (key == "gone-upload") return Answer::Error(404, "NoSuchUpload");
    if (key == "done-upload") return Answer::Xml(200, "<Error><Code>NoSuchUpload</Code></Error>");
    return Answer::Error(400, "InvalidArgument", "bad\r\nthing\x01" + std::string(1000, 'x'));
  });
  ASSERT_TRUE(server.ok());
  S3Client client(Config(server));
  char buf[8];
  S3Object obj;
  obj.exists = true;
  ASSERT_TRUE(client.Head("b", "missing", &obj).ok());
  EXPECT_FALSE(obj.exists);
  EXPECT_EQ(client.GetRange("b", "missing", 0, 8, buf).code(), Code::kNotFound);
  EXPECT_EQ(client.GetRange("b", "denied", 0, 8, buf).code(), Code::kPermissionDenied);
  EXPECT_EQ(client.GetRange("b", "replaced", 0, 8, buf, "etag1").code(), Code::kFailedPrecondition);
  EXPECT_EQ(server.requests().back().Header("if-match"), "\"etag1\"");
  EXPECT_TRUE(client.Delete("b", "missing").ok());
  EXPECT_TRUE(client.AbortMultipart("b", "gone-upload", "up").ok());
  std::string etag;
  EXPECT_EQ(client.CompleteMultipart("b", "done-upload", "up", {"e"}, &etag).code(), Code::kNotFound);
  const Status bad = client.GetRange("b", "other", 0, 8, buf);
  EXPECT_EQ(bad.code(), Code::kInvalidArgument);
  EXPECT_NE(bad.message().find("HTTP 400 InvalidArgument: bad\\x0d\\x0athing\\x01xxx"), std::string::npos)
      << bad.message();
  EXPECT_LT(bad.message().size(), 512u);
  EXPECT_EQ(client.retries_made(), 0u);
}

TEST(S3Client, RetriesDroppedAndCutOffResponses) {
  TestHttpServer server(Scripted([](int n, const SeenRequest&) {
    Answer a = HeadOk();
    if (n == 0) a.drop = true;
    return a;
  }));
  ASSERT_TRUE(server.ok());
  S3Client client(Config(server));
  S3Object obj;
  ASSERT_TRUE(client.Head("b", "k", &obj).ok());
  EXPECT_EQ(client.retries_made(), 1u);

  TestHttpServer cut(Scripted([](int n, const SeenRequest&) {
    Answer a;
    a.status = 206;
    a.headers.emplace_back("Content-Range", "bytes 0-7/8");
    a.body = n == 0 ? "0123" : "01234567";
    if (n == 0) a.claim_length = 8;  // says 8, sends 4, closes
    return a;
  }));
  ASSERT_TRUE(cut.ok());
  S3Client cut_client(Config(cut));
  char buf[8];
  ASSERT_TRUE(cut_client.GetRange("b", "k", 0, 8, buf).ok());
  EXPECT_EQ(std::string(buf, 8), "01234567");
  EXPECT_EQ(cut_client.retries_made(), 1u);
}

TEST(S3Client, KeepsConnectionsAlive) {
  TestHttpServer server([](const SeenRequest&) { return HeadOk(); });
  ASSERT_TRUE(server.ok());
  S3Client client(Config(server));
  S3Object obj;
  for (int i = 0; i < 5; ++i) ASSERT_TRUE(client.Head("b", "k", &obj).ok());
  EXPECT_EQ(server.connections(), 1);
}

TEST(S3Client, CancelEndsAHungTransferAndLaterCalls) {
  TestHttpServer server([](const SeenRequest&) {
    Answer a;
    a.hang = true;
    return a;
  });
  ASSERT_TRUE(server.ok());
  S3Config config = Config(server);
  config.stall_timeout = std::chrono::minutes(10);  // only Cancel can end it
  S3Client client(config);
  char buf[8];
  auto call = std::async(std::launch::async, [&] { return client.GetRange("b", "k", 0, 8, buf); });
  ASSERT_TRUE(server.WaitForRequests(1));
  client.Cancel();
  ASSERT_EQ(call.wait_for(std::chrono::seconds(60)), std::future_status::ready);  // a bound against hangs only
  EXPECT_EQ(call.get().code(), Code::kCancelled);
  S3Object obj;
  EXPECT_EQ(client.Head("b", "k", &obj).code(), Code::kCancelled);
  EXPECT_EQ(server.request_count(), 1u);
}

TEST(S3Client, CancelEndsABackoffSleep) {
  TestHttpServer server([](const SeenRequest&) { return Answer::Error(503, "SlowDown"); });
  ASSERT_TRUE(server.ok());
  S3Config config = Config(server);
  config.backoff = config.max_backoff = std::chrono::hours(1);
  S3Client client(config);
  S3Object obj;
  auto call = std::async(std::launch::async, [&] { return client.Head("b", "k", &obj); });
  ASSERT_TRUE(Eventually([&] { return client.retries_made() >= 1; }));
  client.Cancel();
  ASSERT_EQ(call.wait_for(std::chrono::seconds(60)), std::future_status::ready);
  EXPECT_EQ(call.get().code(), Code::kCancelled);
}

TEST(S3Client, BackoffIsMeasuredOnTheConfiguredClock) {
  TestHttpServer server(Scripted([](int n, const SeenRequest&) {
    return n == 0 ? Answer::Error(503, "SlowDown") : HeadOk();
  }));
  ASSERT_TRUE(server.ok());
  ManualClock clock;
  S3Config config = Config(server);
  config.backoff = config.max_backoff = std::chrono::hours(1);
  config.request_timeout = std::chrono::hours(2);
  config.clock = &clock;
  S3Client client(config);
  S3Object obj;
  auto call = std::async(std::launch::async, [&] { return client.Head("b", "k", &obj); });
  auto done = [&] { return call.wait_for(std::chrono::seconds(0)) == std::future_status::ready; };
  ASSERT_TRUE(Eventually([&] { return clock.waits() >= 1 || done(); }));
  // Asleep on a clock that does not move, it cannot have finished (unless
  // the jitter drew no sleep at all).
  if (clock.waits() >= 1) {
    EXPECT_FALSE(done());
  }
  clock.Advance(std::chrono::hours(1));
  ASSERT_EQ(call.wait_for(std::chrono::seconds(60)), std::future_status::ready);
  EXPECT_TRUE(call.get().ok());
  EXPECT_EQ(client.retries_made(), 1u);
}

TEST(S3Client, StalledTransferFailsAndIsRetried) {
  TestHttpServer server(Scripted([](int n, const SeenRequest&) {
    Answer a = HeadOk();
    a.hang = n == 0;
    return a;
  }));
  ASSERT_TRUE(server.ok());
  S3Config config = Config(server);
  config.stall_timeout = std::chrono::seconds(1);
  S3Client client(config);
  S3Object obj;
  ASSERT_TRUE(client.Head("b", "k", &obj).ok());
  EXPECT_EQ(client.retries_made(), 1u);
}

TEST(S3Client, ARequestEndsAtItsDeadlineOnTheConfiguredClock) {
  // An endpoint that takes the body and never answers: without a deadline
  // only the stall timer (minutes here) would end each attempt.
  TestHttpServer server([](const SeenRequest&) {
    Answer a;
    a.hang = true;
    return a;
  });
  ASSERT_TRUE(server.ok());
  ManualClock clock;
  S3Config config = Config(server);
  config.stall_timeout = std::chrono::minutes(10);
  config.request_timeout = std::chrono::minutes(2);
  config.clock = &clock;
  S3Client client(config);
  const std::string body(4096, 'x');
  std::string etag;
  auto call = std::async(std::launch::async, [&] { return client.Put("b", "k", body.data(), body.size(), &etag); });
  ASSERT_TRUE(server.WaitForRequests(1));
  EXPECT_EQ(server.requests().at(0).body, body);  // the body went; no answer comes
  clock.Advance(std::chrono::minutes(1));
  EXPECT_EQ(call.wait_for(std::chrono::milliseconds(100)), std::future_status::timeout);  // not due yet
  clock.Advance(std::chrono::minutes(1));
  ASSERT_EQ(call.wait_for(std::chrono::seconds(60)), std::future_status::ready);  // a bound against hangs only
  const Status s = call.get();
  EXPECT_EQ(s.code(), Code::kDeadlineExceeded) << s.ToString();
  EXPECT_EQ(s.message(), "S3 PUT b/k: not done within 120000 ms (s3_request_timeout_ms)");
  EXPECT_EQ(server.request_count(), 1u);
}

TEST(S3Client, RetriesAndTheirBackoffEndAtTheDeadlineToo) {
  TestHttpServer server([](const SeenRequest&) { return Answer::Error(503, "SlowDown", "Reduce your request rate."); });
  ASSERT_TRUE(server.ok());
  ManualClock clock;
  S3Config config = Config(server);
  config.retries = 100;
  config.backoff = config.max_backoff = std::chrono::hours(1);
  config.request_timeout = std::chrono::minutes(2);
  config.clock = &clock;
  S3Client client(config);
  S3Object obj;
  auto call = std::async(std::launch::async, [&] { return client.Head("b", "k", &obj); });
  auto done = [&] { return call.wait_for(std::chrono::seconds(0)) == std::future_status::ready; };
  // Asleep between attempts (unless the jitter drew no sleep: then the
  // next attempt came), on a clock that does not move.
  ASSERT_TRUE(Eventually([&] { return clock.waits() >= 1 || done(); }));
  clock.Advance(std::chrono::minutes(2));  // the sleep is cut to the deadline
  ASSERT_EQ(call.wait_for(std::chrono::seconds(60)), std::future_status::ready);
  const Status s = call.get();
  EXPECT_EQ(s.code(), Code::kDeadlineExceeded) << s.ToString();
  EXPECT_EQ(s.message(), "S3 HEAD b/k: not done within 120000 ms (s3_request_timeout_ms); the last attempt: HTTP 503");
}

Answer Range(int status, const std::string& content_range, const std::string& body) {
  Answer a;
  a.status = status;
  if (!content_range.empty()) a.headers.emplace_back("Content-Range", content_range);
  a.body = body;
  return a;
}

TEST(S3Client, GetRangeTakesExactlyTheBytesAskedFor) {
  TestHttpServer server([](const SeenRequest& r) {
    const std::string key = r.path.substr(3);
    if (key == "more") return Range(206, "bytes 0-9/100", std::string(15, 'm'));
    if (key == "fewer") return Range(206, "bytes 0-9/100", "01234");
    if (key == "other") return Range(206, "bytes 5-14/100", "0123456789");
    if (key == "whole") return Range(200, "", std::string(100, 'w'));
    if (key == "short") return Range(206, "bytes 90-99/100", "0123456789");
    if (key == "exact") return Range(200, "", "0123456789");
    return Range(206, "bytes 0-9/100", "0123456789");
  });
  ASSERT_TRUE(server.ok());
  S3Client client(Config(server));
  char buf[20];
  std::memset(buf, '#', sizeof(buf));
  EXPECT_EQ(client.GetRange("b", "more", 0, 10, buf).code(), Code::kInternal);
  EXPECT_EQ(std::string(buf + 10, 10), std::string(10, '#'));  // nothing written past the range
  EXPECT_EQ(client.GetRange("b", "fewer", 0, 10, buf).code(), Code::kInternal);
  EXPECT_EQ(client.GetRange("b", "other", 0, 10, buf).code(), Code::kInternal);
  EXPECT_EQ(client.GetRange("b", "whole", 0, 10, buf).code(), Code::kInternal);
  EXPECT_EQ(client.GetRange("b", "short", 90, 20, buf).code(), Code::kOutOfRange);
  ASSERT_TRUE(client.GetRange("b", "exact", 0, 10, buf).ok());
  EXPECT_EQ(std::string(buf, 10), "0123456789");
  ASSERT_TRUE(client.GetRange("b", "k", 0, 10, buf).ok());
  EXPECT_EQ(server.requests().back().Header("range"), "bytes=0-9");
  EXPECT_EQ(client.retries_made(), 0u);
}

TEST(S3Client, MetadataGoesUpWithTheObjectAndComesBackWithItsAnswers) {
  TestHttpServer server([](const SeenRequest& r) {
    if (r.method == "PUT") {
      Answer a;
      a.headers = {{"ETag", "\"e\""}};
      return a;
    }
    Answer a = r.method == "HEAD" ? HeadOk() : Range(206, "bytes 0-3/42", "abcd");
    a.headers.emplace_back("X-Amz-Meta-TCE-UID", "1001");  // names come back in any case
    a.headers.emplace_back("x-amz-meta-other", "x");
    return a;
  });
  ASSERT_TRUE(server.ok());
  S3Client client(Config(server));
  std::string etag;
  ASSERT_TRUE(client.Put("b", "k", "data", 4, &etag, {{"tce-uid", "1001"}}).ok());
  EXPECT_EQ(server.requests().at(0).Header("x-amz-meta-tce-uid"), "1001");
  for (const S3Metadata& bad :
       {S3Metadata{{"Tce-Uid", "1"}}, S3Metadata{{"tce-uid", "a\r\nb"}}, S3Metadata{{"x", ""}}}) {
    EXPECT_EQ(client.Put("b", "k", "data", 4, &etag, bad).code(), Code::kInvalidArgument);
  }
  EXPECT_EQ(server.request_count(), 1u);  // refused before anything was sent
  S3Object obj;
  ASSERT_TRUE(client.Head("b", "k", &obj).ok());
  EXPECT_EQ(obj.metadata, (S3Metadata{{"tce-uid", "1001"}, {"other", "x"}}));
  // A read shows its answer's metadata before a byte is written: refused, nothing lands.
  char buf[4] = {'-', '-', '-', '-'};
  S3Metadata seen;
  const Status refused = client.GetRange("b", "k", 0, 4, buf, "", [&](const S3Metadata& m) {
    seen = m;
    return Status::PermissionDenied("not yours");
  });
  EXPECT_EQ(refused.code(), Code::kPermissionDenied) << refused.ToString();
  EXPECT_EQ(refused.message(), "not yours");
  EXPECT_EQ(seen.at("tce-uid"), "1001");
  EXPECT_EQ(std::string(buf, 4), "----");
  ASSERT_TRUE(client.GetRange("b", "k", 0, 4, buf, "", [](const S3Metadata&) { return Status::OK(); }).ok());
  EXPECT_EQ(std::string(buf, 4), "abcd");
}

TEST(S3Client, ListReadsEveryPage) {
  TestHttpServer server(Scripted([](int n, const SeenRequest&) {
    if (n == 0) {
      return Answer::Xml(200, "<ListBucketResult><IsTruncated>true</IsTruncated><Contents><Key>p/a&amp;1</Key>"
                              "<Size>3</Size><ETag>&quot;e1&quot;</ETag></Contents><NextContinuationToken>t/1="
                              "</NextContinuationToken></ListBucketResult>");
    }
    return Answer::Xml(200, "<ListBucketResult><Contents><Key>p/b</Key><Size>18446744073709551615</Size>"
                            "<ETag>\"e2-2\"</ETag></Contents><IsTruncated>false</IsTruncated></ListBucketResult>");
  }));
  ASSERT_TRUE(server.ok());
  S3Client client(Config(server));
  std::vector<S3Listed> listed;
  ASSERT_TRUE(client.List("b", "p/", &listed).ok());
  ASSERT_EQ(listed.size(), 2u);
  EXPECT_EQ(listed[0].key, "p/a&1");
  EXPECT_EQ(listed[0].size, 3u);
  EXPECT_EQ(listed[0].etag, "e1");
  EXPECT_EQ(listed[1].size, UINT64_MAX);
  EXPECT_EQ(listed[1].etag, "e2-2");
  EXPECT_EQ(server.requests().at(0).target, "/b?list-type=2&prefix=p%2F");
  EXPECT_EQ(server.requests().at(1).query, "continuation-token=t%2F1%3D&list-type=2&prefix=p%2F");
}

TEST(S3Client, ListUploadsReadsEveryPage) {
  TestHttpServer server(Scripted([](int n, const SeenRequest&) {
    if (n == 0) {
      return Answer::Xml(200, "<ListMultipartUploadsResult><KeyMarker></KeyMarker><IsTruncated>true</IsTruncated>"
                              "<NextKeyMarker>k1</NextKeyMarker><NextUploadIdMarker>u1</NextUploadIdMarker>"
                              "<Upload><Key>k1</Key><UploadId>u1</UploadId><Initiator><ID>x</ID></Initiator>"
                              "<Initiated>2024-01-02T03:04:05.000Z</Initiated></Upload></ListMultipartUploadsResult>");
    }
    return Answer::Xml(200, "<ListMultipartUploadsResult><IsTruncated>false</IsTruncated><Upload><Key>k2</Key>"
                            "<UploadId>u2</UploadId></Upload></ListMultipartUploadsResult>");
  }));
  ASSERT_TRUE(server.ok());
  S3Client client(Config(server));
  std::vector<S3Upload> uploads;
  ASSERT_TRUE(client.ListUploads("b", "", &uploads).ok());
  ASSERT_EQ(uploads.size(), 2u);
  EXPECT_EQ(uploads[0].key, "k1");
  EXPECT_EQ(uploads[0].upload_id, "u1");
  EXPECT_EQ(uploads[0].initiated, "2024-01-02T03:04:05.000Z");
  EXPECT_EQ(uploads[1].upload_id, "u2");
  EXPECT_EQ(server.requests().at(1).query, "key-marker=k1&prefix=&upload-id-marker=u1&uploads=");
}

TEST(S3Client, RefusesMalformedAndOversizedListings) {
  TestHttpServer server([](const SeenRequest& r) {
    const std::string prefix = r.query.substr(r.query.find("prefix=") + 7);
    if (prefix == "size") {
      return Answer::Xml(200, "<ListBucketResult><Contents><Key>a</Key><Size>1e3</Size><ETag>e</ETag></Contents>"
                              "</ListBucketResult>");
    }
    if (prefix == "etag") {
      return Answer::Xml(200, "<ListBucketResult><Contents><Key>a</Key><Size>1</Size><ETag>a&#10;b</ETag>"
                              "</Contents></ListBucketResult>");
    }
    if (prefix == "loop") {
      return Answer::Xml(200, "<ListBucketResult><IsTruncated>true</IsTruncated></ListBucketResult>");
    }
    return Answer::Xml(200, "<ListBucketResult>" + std::string(17 << 20, ' ') + "</ListBucketResult>");
  });
  ASSERT_TRUE(server.ok());
  S3Client client(Config(server));
  std::vector<S3Listed> listed;
  for (const char* prefix : {"size", "etag", "loop", "big"}) {
    const Status s = client.List("b", prefix, &listed);
    EXPECT_EQ(s.code(), Code::kInternal) << prefix << ": " << s.ToString();
  }
  EXPECT_EQ(client.retries_made(), 0u);
}

TEST(S3Client, RefusesWhatS3WouldMisread) {
  TestHttpServer server([](const SeenRequest&) { return HeadOk(); });
  ASSERT_TRUE(server.ok());
  S3Object obj;
  for (const char* endpoint : {"ftp://host", "http://", "http://host/path", "host:9000"}) {
    S3Config config = Config(server);
    config.endpoint = endpoint;
    EXPECT_EQ(S3Client(config).Head("b", "k", &obj).code(), Code::kInvalidArgument) << endpoint;
  }
  S3Config config = Config(server);
  config.path_style = false;  // a bucket cannot be a subdomain of an address
  EXPECT_EQ(S3Client(config).Head("b", "k", &obj).code(), Code::kInvalidArgument);
  config = Config(server);
  config.resolve = {"not-host-port-addr"};
  EXPECT_EQ(S3Client(config).Head("b", "k", &obj).code(), Code::kInvalidArgument);
  config = Config(server);
  config.credentials.session_token = "tok\r\nX-Injected: 1";
  EXPECT_EQ(S3Client(config).Head("b", "k", &obj).code(), Code::kInvalidArgument);
  S3Client client(Config(server));
  EXPECT_EQ(client.Head("b/x", "k", &obj).code(), Code::kInvalidArgument);
  EXPECT_EQ(client.Head("b", "", &obj).code(), Code::kInvalidArgument);
  EXPECT_EQ(client.GetRange("b", "k", 0, 4, nullptr, "bad\"etag").code(), Code::kInvalidArgument);
  EXPECT_EQ(client.UploadPart("b", "k", "up", 10001, "x", 1, nullptr).code(), Code::kInvalidArgument);
  EXPECT_EQ(server.request_count(), 0u);
}

}  // namespace
}  // namespace tce
