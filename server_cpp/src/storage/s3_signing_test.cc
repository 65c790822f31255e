// The client's signatures, checked against an independent SigV4 signer
// written here from the specification (itself checked against AWS's
// published examples), and the credentials' loading and secrecy.
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <stdlib.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <algorithm>
#include <fstream>
#include <map>

#include "common/testing.h"
#include "storage/s3_client.h"
#include "storage/s3_test_server.h"

namespace tce {
namespace {

constexpr char kAccess[] = "AKIAIOSFODNN7EXAMPLE";
constexpr char kSecret[] = "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY";
constexpr char kEmptyHash[] = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855";

// ---- an independent SigV4 signer (test code) ----

std::string Hex(const unsigned char* p, size_t n) {
  static const char kDigits[] = "0123456789abcdef";
  std::string out;
  for (size_t i = 0; i < n; ++i) {
    out += kDigits[p[i] >> 4];
    out += kDigits[p[i] & 15];
  }
  return out;
}

std::string Sha256Hex(const std::string& data) {
  unsigned char md[32];
  unsigned int len = 0;
  EVP_Digest(data.data(), data.size(), md, &len, EVP_sha256(), nullptr);
  return Hex(md, len);
}

std::string Hmac(const std::string& key, const std::string& data) {
  unsigned char md[32];
  unsigned int len = 0;
  HMAC(EVP_sha256(), key.data(), static_cast<int>(key.size()), reinterpret_cast<const unsigned char*>(data.data()),
       data.size(), md, &len);
  return std::string(reinterpret_cast<char*>(md), len);
}

// RFC 3986 unreserved characters stay, everything else is %XX.
std::string Encode(const std::string& s, bool path) {
  std::string out;
  char buf[4];
  for (unsigned char c : s) {
    if (isalnum(c) || c == '-' || c == '_' || c == '.' || c == '~' || (path && c == '/')) {
      out += static_cast<char>(c);
    } else {
      snprintf(buf, sizeof(buf), "%%%02X", c);
      out += buf;
    }
  }
  return out;
}

std::string Decode(const std::string& s) {
  std::string out;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '%' && i + 2 < s.size()) {
      out += static_cast<char>(std::stoi(s.substr(i + 1, 2), nullptr, 16));
      i += 2;
    } else {
      out += s[i];
    }
  }
  return out;
}

struct SigInput {
  std::string method, path, query;                // path and query as on the wire
  std::map<std::string, std::string> headers;     // the signed ones, lower-case names
  std::string payload_hash, amz_date, region = "us-east-1";
};

std::string Sign(const std::string& secret, const SigInput& in) {
  // Canonical query: every parameter decoded and encoded again, sorted.
  std::vector<std::pair<std::string, std::string>> params;
  size_t pos = 0;
  while (pos < in.query.size()) {
    size_t amp = in.query.find('&', pos);
    if (amp == std::string::npos) amp = in.query.size();
    const std::string p = in.query.substr(pos, amp - pos);
    const size_t eq = p.find('=');
    params.emplace_back(Encode(Decode(p.substr(0, eq)), false),
                        eq == std::string::npos ? "" : Encode(Decode(p.substr(eq + 1)), false));
    pos = amp + 1;
  }
  std::sort(params.begin(), params.end());
  std::string query, names, headers;
  for (const auto& p : params) query += (query.empty() ? "" : "&") + p.first + "=" + p.second;
  for (const auto& h : in.headers) {
    headers += h.first + ":" + h.second + "\n";
    names += (names.empty() ? "" : ";") + h.first;
  }
  const std::string canonical = in.method + "\n" + Encode(Decode(in.path), true) + "\n" + query + "\n" + headers +
                                "\n" + names + "\n" + in.payload_hash;
  const std::string date = in.amz_date.substr(0, 8);
  const std::string scope = date + "/" + in.region + "/s3/aws4_request";
  const std::string to_sign = "AWS4-HMAC-SHA256\n" + in.amz_date + "\n" + scope + "\n" + Sha256Hex(canonical);
  std::string key = Hmac("AWS4" + secret, date);
  key = Hmac(Hmac(Hmac(key, in.region), "s3"), "aws4_request");
  const std::string sig = Hmac(key, to_sign);
  return Hex(reinterpret_cast<const unsigned char*>(sig.data()), sig.size());
}

std::string Field(const std::string& auth, const std::string& name) {
  const size_t at = auth.find(name + "=");
  if (at == std::string::npos) return "";
  const size_t begin = at + name.size() + 1;
  const size_t end = auth.find_first_of(", ", begin);
  return auth.substr(begin, end == std::string::npos ? std::string::npos : end - begin);
}

// The signature `req` should carry, from the headers its Authorization
// names, as they arrived.
std::string Recompute(const SeenRequest& req, const std::string& secret) {
  const std::string auth = req.Header("authorization");
  SigInput in{req.method, req.path, req.query, {}, req.Header("x-amz-content-sha256"), req.Header("x-amz-date")};
  std::string names = Field(auth, "SignedHeaders") + ";";
  for (size_t pos = 0, semi; (semi = names.find(';', pos)) != std::string::npos; pos = semi + 1) {
    const std::string name = names.substr(pos, semi - pos);
    if (!req.Has(name)) return "missing signed header " + name;
    in.headers[name] = req.Header(name);
  }
  return Sign(secret, in);
}

TEST(S3Signing, IndependentSignerMatchesAwsExamples) {
  SigInput get{"GET", "/test.txt", "", {}, kEmptyHash, "20130524T000000Z"};
  get.headers = {{"host", "examplebucket.s3.amazonaws.com"}, {"range", "bytes=0-9"},
                 {"x-amz-content-sha256", kEmptyHash}, {"x-amz-date", "20130524T000000Z"}};
  EXPECT_EQ(Sign(kSecret, get), "f0e8bdb87c964420e857bd35b5d6ed310bd44f0170aba48dd91039c6036bdb41");
  SigInput lifecycle = get;
  lifecycle.path = "/";
  lifecycle.query = "lifecycle=";
  lifecycle.headers.erase("range");
  EXPECT_EQ(Sign(kSecret, lifecycle), "fea454ca298b7da1c68078a5d1bdbfbbe0d65c699e0f91ac7a200a0136783543");
  SigInput list = lifecycle;
  list.query = "max-keys=2&prefix=J";
  EXPECT_EQ(Sign(kSecret, list), "34b48302e7b5fa45bde8084f4b7868a86f0a534bc59db6670ed5711ef69dc6f7");
}

S3Config TestConfig(const std::string& endpoint) {
  S3Config config;
  config.endpoint = endpoint;
  config.path_style = true;
  config.credentials = {kAccess, kSecret, ""};
  config.amz_date = [] { return std::string("20130524T000000Z"); };
  config.backoff = std::chrono::milliseconds(1);
  return config;
}

// Answers as S3 would, enough for every call to succeed.
Answer FakeS3(const SeenRequest& r) {
  Answer a;
  a.headers.emplace_back("ETag", "\"0123456789abcdef0123456789abcdef\"");
  if (r.method == "HEAD") {
    a.headers.emplace_back("Content-Length", "10");
  } else if (r.method == "GET" && r.query.find("list-type=2") != std::string::npos) {
    a = Answer::Xml(200, "<ListBucketResult><IsTruncated>false</IsTruncated></ListBucketResult>");
  } else if (r.method == "GET" && r.query.find("uploads=") != std::string::npos) {
    a = Answer::Xml(200, "<ListMultipartUploadsResult><IsTruncated>false</IsTruncated></ListMultipartUploadsResult>");
  } else if (r.method == "GET") {
    a.status = 206;
    a.headers.emplace_back("Content-Range", "bytes 0-9/100");
    a.body = "0123456789";
  } else if (r.method == "POST" && r.query == "uploads=") {
    a = Answer::Xml(200, "<InitiateMultipartUploadResult><UploadId>up-1</UploadId></InitiateMultipartUploadResult>");
  } else if (r.method == "POST") {
    a = Answer::Xml(200, "<CompleteMultipartUploadResult><ETag>\"abc-2\"</ETag></CompleteMultipartUploadResult>");
  } else if (r.method == "DELETE") {
    a.status = 204;
  }
  return a;
}

// The literal example, through the client's request path: it needs the
// host's own port (80), so a loopback address of its own takes it.
TEST(S3Signing, ClientSignsAwsGetObjectExample) {
  const std::string addr = "127.83." + std::to_string(getpid() % 250 + 1) + ".7";
  TestHttpServer server(FakeS3, addr, 80);
  if (!server.ok()) GTEST_SKIP() << "cannot listen on " << addr << ":80 (needs the right to bind port 80)";
  S3Config config = TestConfig("http://s3.amazonaws.com");
  config.path_style = false;
  config.resolve = {"examplebucket.s3.amazonaws.com:80:" + addr};
  S3Client client(config);
  char buf[10];
  ASSERT_TRUE(client.GetRange("examplebucket", "test.txt", 0, 10, buf).ok());
  const SeenRequest r = server.requests().at(0);
  EXPECT_EQ(r.Header("host"), "examplebucket.s3.amazonaws.com");
  const std::string auth = r.Header("authorization");
  EXPECT_EQ(Field(auth, "Credential"), "AKIAIOSFODNN7EXAMPLE/20130524/us-east-1/s3/aws4_request");
  EXPECT_EQ(Field(auth, "SignedHeaders"), "host;range;x-amz-content-sha256;x-amz-date");
  EXPECT_EQ(Field(auth, "Signature"), "f0e8bdb87c964420e857bd35b5d6ed310bd44f0170aba48dd91039c6036bdb41");
}

TEST(S3Signing, EveryCallIsSignedAsSigV4Specifies) {
  TestHttpServer server(FakeS3);
  ASSERT_TRUE(server.ok());
  S3Client client(TestConfig(server.endpoint()));
  const std::string key = "dir/a b+c=d&e%f\xc3\xa9/../x";  // kept as a name, each byte encoded once
  S3Object obj;
  char buf[10];
  std::string etag, upload;
  std::vector<S3Listed> listed;
  std::vector<S3Upload> uploads;
  ASSERT_TRUE(client.Head("bkt", key, &obj).ok());
  ASSERT_TRUE(client.GetRange("bkt", key, 0, 10, buf, "0123456789abcdef0123456789abcdef").ok());
  ASSERT_TRUE(client.Put("bkt", key, "hello", 5, &etag).ok());
  ASSERT_TRUE(client.CreateMultipart("bkt", key, &upload).ok());
  ASSERT_TRUE(client.UploadPart("bkt", key, upload, 1, "part", 4, &etag).ok());
  ASSERT_TRUE(client.CompleteMultipart("bkt", key, upload, {etag}, &etag).ok());
  ASSERT_TRUE(client.AbortMultipart("bkt", key, upload).ok());
  ASSERT_TRUE(client.Delete("bkt", key).ok());
  ASSERT_TRUE(client.List("bkt", "J/ +", &listed).ok());
  ASSERT_TRUE(client.ListUploads("bkt", "J", &uploads).ok());
  const std::vector<SeenRequest> seen = server.requests();
  ASSERT_EQ(seen.size(), 10u);
  EXPECT_EQ(seen[0].path, "/bkt/dir/a%20b%2Bc%3Dd%26e%25f%C3%A9/../x");
  for (const SeenRequest& r : seen) {
    SCOPED_TRACE(r.method + " " + r.target);
    EXPECT_EQ(Field(r.Header("authorization"), "Signature"), Recompute(r, kSecret));
    EXPECT_EQ(r.Header("x-amz-content-sha256"), r.body.empty() ? kEmptyHash : "UNSIGNED-PAYLOAD");
    // curl sends "Expect: 100-continue" with a PUT (without waiting for the
    // answer); unsigned, as it must be: a signed header curl does not send
    // is what makes S3 refuse a signature.
    EXPECT_EQ(Field(r.Header("authorization"), "SignedHeaders").find("expect"), std::string::npos);
  }
  EXPECT_EQ(seen[1].Header("if-match"), "\"0123456789abcdef0123456789abcdef\"");
  EXPECT_EQ(seen[2].Header("x-amz-checksum-crc32"), "NhCmhg==");  // CRC-32("hello") = 0x3610a686, big-endian
  EXPECT_NE(Field(seen[2].Header("authorization"), "SignedHeaders").find("x-amz-checksum-crc32"), std::string::npos);
  EXPECT_EQ(seen[8].query, "list-type=2&prefix=J%2F%20%2B");
  EXPECT_EQ(seen[9].query, "prefix=J&uploads=");
}

TEST(S3Signing, SessionTokenIsSentAndSigned) {
  TestHttpServer server(FakeS3);
  ASSERT_TRUE(server.ok());
  S3Config config = TestConfig(server.endpoint());
  config.credentials.session_token = "IQoJb3JpZ2luX2VjEXAMPLETOKEN//+==";
  S3Client client(config);
  S3Object obj;
  ASSERT_TRUE(client.Head("bkt", "k", &obj).ok());
  const SeenRequest r = server.requests().at(0);
  EXPECT_EQ(r.Header("x-amz-security-token"), config.credentials.session_token);
  EXPECT_EQ(Field(r.Header("authorization"), "SignedHeaders"),
            "host;x-amz-content-sha256;x-amz-date;x-amz-security-token");
  EXPECT_EQ(Field(r.Header("authorization"), "Signature"), Recompute(r, kSecret));
}

TEST(S3Signing, BodiesCarryTheChecksumTheConfigAsksFor) {
  TestHttpServer server(FakeS3);
  ASSERT_TRUE(server.ok());
  for (const char* kind : {"crc32", "md5", "none"}) {
    S3Config config = TestConfig(server.endpoint());
    config.checksum = kind;
    S3Client client(config);
    std::string etag;
    ASSERT_TRUE(client.Put("bkt", "k", "hello", 5, &etag).ok());
  }
  const std::vector<SeenRequest> seen = server.requests();
  ASSERT_EQ(seen.size(), 3u);
  EXPECT_EQ(seen[0].Header("x-amz-checksum-crc32"), "NhCmhg==");
  EXPECT_FALSE(seen[0].Has("content-md5"));
  EXPECT_EQ(seen[1].Header("content-md5"), "XUFAKrxLKna5cZ2REBfFkg==");  // MD5("hello")
  EXPECT_FALSE(seen[1].Has("x-amz-checksum-crc32"));
  EXPECT_FALSE(seen[2].Has("content-md5") || seen[2].Has("x-amz-checksum-crc32"));
  for (const SeenRequest& r : seen) EXPECT_EQ(Field(r.Header("authorization"), "Signature"), Recompute(r, kSecret));
}

TEST(S3Signing, NoCredentialsSendNoAuthorization) {
  TestHttpServer server(FakeS3);
  ASSERT_TRUE(server.ok());
  S3Config config = TestConfig(server.endpoint());
  config.credentials = S3Credentials();
  S3Client client(config);
  S3Object obj;
  ASSERT_TRUE(client.Head("bkt", "k", &obj).ok());
  EXPECT_FALSE(server.requests().at(0).Has("authorization"));
}

TEST(S3Signing, ErrorsNeverHoldTheSecrets) {
  const std::string token = "SECRETSESSIONTOKEN0123456789";
  // A server that echoes what it was sent, token included.
  TestHttpServer server([](const SeenRequest& r) {
    const int status = r.method == "DELETE" ? 503 : 403;
    return Answer::Error(status, "AccessDenied", "you sent " + r.Header("x-amz-security-token") + " and " +
                                                     r.Header("authorization"));
  });
  ASSERT_TRUE(server.ok());
  S3Config config = TestConfig(server.endpoint());
  config.credentials.session_token = token;
  config.retries = 1;
  S3Client client(config);
  char buf[4];
  const Status denied = client.GetRange("bkt", "k", 0, 4, buf);
  EXPECT_EQ(denied.code(), Status::Code::kPermissionDenied) << denied.ToString();
  const Status exhausted = client.Delete("bkt", "k");
  EXPECT_EQ(exhausted.code(), Status::Code::kUnavailable) << exhausted.ToString();
  // A 200 whose body is no answer but the request echoed back: quoted in the error.
  TestHttpServer echo(
      [](const SeenRequest& r) { return Answer::Xml(200, "<Echo>" + r.Header("authorization") + "</Echo>"); });
  ASSERT_TRUE(echo.ok());
  S3Config echoed = TestConfig(echo.endpoint());
  echoed.credentials.session_token = token;
  S3Client echoing(echoed);
  std::string upload_id;
  const Status malformed = echoing.CreateMultipart("bkt", "k", &upload_id);
  EXPECT_EQ(malformed.code(), Status::Code::kInternal) << malformed.ToString();
  config.endpoint = "http://127.0.0.1:1";  // nothing listens there
  S3Client unreachable(config);
  const Status refused = unreachable.Delete("bkt", "k");
  EXPECT_EQ(refused.code(), Status::Code::kUnavailable) << refused.ToString();
  for (const Status& s : {denied, exhausted, refused, malformed}) {
    EXPECT_EQ(s.message().find(token), std::string::npos) << s.message();
    EXPECT_EQ(s.message().find(kSecret), std::string::npos) << s.message();
    // Authorization's Credential=<access key id>/<date>/... came back too.
    EXPECT_EQ(s.message().find(kAccess), std::string::npos) << s.message();
  }
  EXPECT_NE(denied.message().find("<redacted>"), std::string::npos) << denied.message();
  EXPECT_NE(malformed.message().find("<redacted>"), std::string::npos) << malformed.message();
}

// ---- credentials ----

std::string WriteFile(const std::string& dir, const std::string& text) {
  const std::string path = dir + "/credentials";
  std::ofstream(path) << text;
  return path;
}

TEST(S3Credentials, ReadsProfilesFromSharedFile) {
  const std::string dir = MakeTempDir("s3cred");
  const std::string file = WriteFile(dir,
                                     "# comment\n[default]\naws_access_key_id = AKDEFAULT\n"
                                     "aws_secret_access_key=secretdefault\r\n\n"
                                     "[profile ci]\n  aws_access_key_id=AKCI\naws_secret_access_key = s=ci\n"
                                     "aws_session_token = tok\nregion = us-west-2\n");
  S3Credentials c;
  ASSERT_TRUE(LoadS3Credentials(file, "", &c).ok());
  EXPECT_EQ(c.access_key, "AKDEFAULT");
  EXPECT_EQ(c.secret_key, "secretdefault");
  EXPECT_EQ(c.session_token, "");
  ASSERT_TRUE(LoadS3Credentials(file, "ci", &c).ok());
  EXPECT_EQ(c.access_key, "AKCI");
  EXPECT_EQ(c.secret_key, "s=ci");
  EXPECT_EQ(c.session_token, "tok");
  EXPECT_EQ(LoadS3Credentials(file, "nope", &c).code(), Status::Code::kNotFound);
  EXPECT_EQ(LoadS3Credentials(dir + "/missing", "", &c).code(), Status::Code::kNotFound);
  unlink(file.c_str());
  rmdir(dir.c_str());
}

TEST(S3Credentials, BadFilesFailWithoutShowingSecrets) {
  const std::string dir = MakeTempDir("s3cred");
  S3Credentials c;
  const std::string secret = "TOPSECRETVALUE123";
  for (const std::string& text : {"[default]\naws_secret_access_key = " + secret + "\n",        // no key id
                                  "[default]\naws_access_key_id = A\n" + secret + "\n",       // not key = value
                                  "[default\naws_secret_access_key = " + secret + "\n",       // broken section
                                  "[default]\naws_access_key_id=A\naws_secret_access_key=" + secret +
                                      "\naws_session_token=a\x01" "b\n"}) {                  // control character
    const Status s = LoadS3Credentials(WriteFile(dir, text), "default", &c);
    EXPECT_EQ(s.code(), Status::Code::kInvalidArgument) << s.ToString();
    EXPECT_EQ(s.message().find(secret), std::string::npos) << s.message();
    EXPECT_TRUE(c.secret_key.empty());
  }
  const Status big = LoadS3Credentials(WriteFile(dir, std::string(65 << 10, '#')), "default", &c);
  EXPECT_EQ(big.code(), Status::Code::kInvalidArgument) << big.ToString();
  unlink((dir + "/credentials").c_str());
  rmdir(dir.c_str());
}

TEST(S3Credentials, ReadsTheEnvironment) {
  setenv("AWS_ACCESS_KEY_ID", "AKENV", 1);
  setenv("AWS_SECRET_ACCESS_KEY", "envsecret", 1);
  setenv("AWS_SESSION_TOKEN", "envtoken", 1);
  S3Credentials c;
  ASSERT_TRUE(LoadS3Credentials("", "ignored", &c).ok());
  EXPECT_EQ(c.access_key, "AKENV");
  EXPECT_EQ(c.secret_key, "envsecret");
  EXPECT_EQ(c.session_token, "envtoken");
  unsetenv("AWS_SECRET_ACCESS_KEY");
  const Status half = LoadS3Credentials("", "", &c);
  EXPECT_EQ(half.code(), Status::Code::kInvalidArgument) << half.ToString();
  unsetenv("AWS_ACCESS_KEY_ID");
  unsetenv("AWS_SESSION_TOKEN");
  EXPECT_EQ(LoadS3Credentials("", "", &c).code(), Status::Code::kNotFound);
}

}  // namespace
}  // namespace tce
