// S3Client's writes: single PUTs and the calls of a multipart upload.
#include <openssl/evp.h>
#include <zlib.h>

#include <algorithm>

#include "storage/s3_client.h"
#include "storage/s3_http.h"
#include "storage/s3_xml.h"

namespace tce {
namespace {

constexpr int kMaxParts = 10000;  // S3's limit

bool Md5(const void* data, size_t n, unsigned char digest[16]) {
  unsigned int len = 0;
  // EVP_Digest fails where MD5 is not allowed (a FIPS provider).
  return EVP_Digest(data, n, digest, &len, EVP_md5(), nullptr) == 1 && len == 16;
}

// The Content-MD5 header for a body: S3 refuses (BadDigest, retried) a body
// damaged on its way, which an unsigned payload would not reveal. Nothing
// where MD5 is unavailable.
std::string ContentMd5Header(const char* data, size_t n) {
  unsigned char digest[16];
  if (!Md5(data, n, digest)) return "";
  unsigned char b64[32];
  const int len = EVP_EncodeBlock(b64, digest, 16);
  return "Content-MD5: " + std::string(reinterpret_cast<const char*>(b64), len);
}

// x-amz-checksum-crc32's value: the big-endian CRC-32 of the body, base64
// (about 8x cheaper to compute than MD5, and S3 checks it all the same).
std::string Crc32Base64(const char* data, size_t n) {
  uLong c = crc32(0L, Z_NULL, 0);
  for (size_t done = 0; done < n;) {
    const uInt chunk = static_cast<uInt>(std::min<size_t>(n - done, 1u << 30));
    c = crc32(c, reinterpret_cast<const Bytef*>(data + done), chunk);
    done += chunk;
  }
  const unsigned char be[4] = {static_cast<unsigned char>(c >> 24), static_cast<unsigned char>(c >> 16),
                               static_cast<unsigned char>(c >> 8), static_cast<unsigned char>(c)};
  unsigned char b64[16];
  const int len = EVP_EncodeBlock(b64, be, 4);
  return std::string(reinterpret_cast<const char*>(b64), len);
}

// The ETag S3 gives an object completed from parts with these ETags (the
// MD5 of their MD5s, "-" and their count); empty when one is not an MD5
// (an encrypted object's).
std::string MultipartEtag(const std::vector<std::string>& part_etags) {
  std::string md5s;
  for (const std::string& etag : part_etags) {
    if (etag.size() != 32) return "";
    for (size_t i = 0; i < 32; i += 2) {
      unsigned value = 0;
      for (size_t j = i; j < i + 2; ++j) {
        const char c = etag[j];
        const int d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
        if (d < 0) return "";
        value = value * 16 + d;
      }
      md5s += static_cast<char>(value);
    }
  }
  unsigned char digest[16];
  if (!Md5(md5s.data(), md5s.size(), digest)) return "";
  static const char kHex[] = "0123456789abcdef";
  std::string out;
  for (unsigned char b : digest) {
    out += kHex[b >> 4];
    out += kHex[b & 15];
  }
  return out + "-" + std::to_string(part_etags.size());
}

Status EtagFrom(const std::string& what, const std::string& raw, std::string* etag) {
  if (CleanEtag(raw, etag)) return Status::OK();
  return Status::Internal(what + ": bad ETag '" + Printable(raw, 64) + "'");
}

Status CheckUploadId(const std::string& what, const std::string& upload_id) {
  if (upload_id.empty() || upload_id.size() > 1024) return Status::InvalidArgument(what + ": no upload id");
  return Status::OK();
}

}  // namespace

Status S3Client::AddMetadata(const std::string& what, const S3Metadata& metadata,
                             std::vector<std::string>* headers) {
  for (const auto& [name, value] : metadata) {
    const bool name_ok = !name.empty() && name.size() <= 64 &&
                         name.find_first_not_of("abcdefghijklmnopqrstuvwxyz0123456789-") == std::string::npos;
    const bool value_ok = !value.empty() && value.size() <= 256 && value.front() != ' ' && value.back() != ' ' &&
                          std::all_of(value.begin(), value.end(), [](char c) { return c >= 0x20 && c < 0x7f; });
    if (!name_ok || !value_ok) {
      return Status::InvalidArgument(what + ": metadata '" + Printable(name, 64) +
                                     "' is not a header S3 keeps as given");
    }
    headers->push_back("x-amz-meta-" + name + ": " + value);
  }
  return Status::OK();
}

Status S3Client::Put(const std::string& bucket, const std::string& key, const char* data, size_t n,
                     std::string* etag, const S3Metadata& metadata) {
  Status s = Check(bucket, &key);
  if (!s.ok()) return s;
  Request req("PUT", Url(bucket, key, ""), S3What("PUT", bucket, key));
  req.http.body = data;
  req.http.body_size = n;
  s = AddMetadata(req.what, metadata, &req.http.headers);
  if (!s.ok()) return s;
  AddChecksum(data, n, &req.http.headers, nullptr);
  Reply reply;
  s = Run(&req, &reply);
  if (!s.ok()) return s;
  return Redacted(EtagFrom(req.what, reply.etag, etag));
}

void S3Client::AddChecksum(const char* data, size_t n, std::vector<std::string>* headers,
                           std::string* checksum) const {
  if (config_.checksum == "crc32") {
    const std::string c = Crc32Base64(data, n);
    headers->push_back("x-amz-checksum-crc32: " + c);
    if (checksum) *checksum = c;
  } else if (config_.checksum == "md5") {
    const std::string md5 = ContentMd5Header(data, n);
    if (!md5.empty()) headers->push_back(md5);
  }
}

Status S3Client::CreateMultipart(const std::string& bucket, const std::string& key, std::string* upload_id,
                                 const S3Metadata& metadata) {
  Status s = Check(bucket, &key);
  if (!s.ok()) return s;
  Request req("POST", Url(bucket, key, S3Query({{"uploads", ""}})), S3What("POST", bucket, key + "?uploads"));
  req.http.headers.push_back("Content-Type: application/octet-stream");  // the object's, once completed
  s = AddMetadata(req.what, metadata, &req.http.headers);
  if (!s.ok()) return s;
  if (config_.checksum == "crc32") req.http.headers.push_back("x-amz-checksum-algorithm: CRC32");
  req.xml = true;
  Reply reply;
  s = Run(&req, &reply);
  if (!s.ok()) return s;
  if (!XmlField(reply.body, "UploadId", upload_id) || upload_id->empty() || upload_id->size() > 1024 ||
      Printable(*upload_id, 1024) != *upload_id) {
    return Redacted(Status::Internal(req.what + ": no valid UploadId in '" + Printable(reply.body, 128) + "'"));
  }
  return Status::OK();
}

Status S3Client::UploadPart(const std::string& bucket, const std::string& key, const std::string& upload_id,
                            int part_number, const char* data, size_t n, std::string* etag,
                            std::string* checksum) {
  Status s = Check(bucket, &key);
  if (!s.ok()) return s;
  const std::string what = S3What("PUT", bucket, key) + " part " + std::to_string(part_number);
  if (part_number < 1 || part_number > kMaxParts) return Status::InvalidArgument(what + ": part out of 1..10000");
  s = CheckUploadId(what, upload_id);
  if (!s.ok()) return s;
  Request req("PUT", Url(bucket, key, S3Query({{"partNumber", std::to_string(part_number)}, {"uploadId", upload_id}})),
              what);
  req.http.body = data;
  req.http.body_size = n;
  AddChecksum(data, n, &req.http.headers, checksum);
  Reply reply;
  s = Run(&req, &reply);
  if (!s.ok()) return s;
  return Redacted(EtagFrom(req.what, reply.etag, etag));
}

Status S3Client::CompleteMultipart(const std::string& bucket, const std::string& key, const std::string& upload_id,
                                   const std::vector<std::string>& part_etags, std::string* etag,
                                   const std::vector<std::string>& part_checksums) {
  Status s = Check(bucket, &key);
  if (!s.ok()) return s;
  const std::string what = S3What("POST", bucket, key) + " (complete)";
  s = CheckUploadId(what, upload_id);
  if (!s.ok()) return s;
  if (part_etags.empty() || part_etags.size() > kMaxParts) {
    return Status::InvalidArgument(what + ": " + std::to_string(part_etags.size()) + " parts (1 to 10000 allowed)");
  }
  std::string body = "<CompleteMultipartUpload xmlns=\"http://s3.amazonaws.com/doc/2006-03-01/\">";
  std::vector<std::string> clean(part_etags.size());
  for (size_t i = 0; i < part_etags.size(); ++i) {
    if (!CleanEtag(part_etags[i], &clean[i])) {
      return Status::InvalidArgument(what + ": part " + std::to_string(i + 1) + " has no valid ETag");
    }
    body += "<Part><PartNumber>" + std::to_string(i + 1) + "</PartNumber><ETag>\"" + XmlEscape(clean[i]) + "\"</ETag>";
    if (i < part_checksums.size() && !part_checksums[i].empty())
      body += "<ChecksumCRC32>" + XmlEscape(part_checksums[i]) + "</ChecksumCRC32>";
    body += "</Part>";
  }
  body += "</CompleteMultipartUpload>";
  Request req("POST", Url(bucket, key, S3Query({{"uploadId", upload_id}})), what);
  req.http.headers.push_back("Content-Type: application/xml");
  req.http.body = body.data();
  req.http.body_size = body.size();
  req.xml = true;  // S3 may answer 200 and an <Error> (it starts the answer before it is done)
  Reply reply;
  s = Run(&req, &reply);
  if (s.code() == Status::Code::kNotFound) {
    // An attempt whose reply was lost may have completed the upload: then
    // the object is there with the ETag these parts make. (curl itself
    // sends a request again when a kept-alive connection turns out closed,
    // so even a first attempt may be a second one.)
    const std::string expected = MultipartEtag(clean);
    S3Object object;
    if (!expected.empty() && Head(bucket, key, &object).ok() && object.exists && object.etag == expected) {
      *etag = expected;
      return Status::OK();
    }
  }
  if (!s.ok()) return s;
  std::string raw;
  if (!XmlField(reply.body, "ETag", &raw)) {
    return Redacted(Status::Internal(what + ": no ETag in '" + Printable(reply.body, 128) + "'"));
  }
  return Redacted(EtagFrom(what, raw, etag));
}

Status S3Client::AbortMultipart(const std::string& bucket, const std::string& key, const std::string& upload_id) {
  Status s = Check(bucket, &key);
  if (!s.ok()) return s;
  const std::string what = S3What("DELETE", bucket, key) + " (abort)";
  s = CheckUploadId(what, upload_id);
  if (!s.ok()) return s;
  Request req("DELETE", Url(bucket, key, S3Query({{"uploadId", upload_id}})), what);
  Reply reply;
  s = Run(&req, &reply);
  return s.code() == Status::Code::kNotFound ? Status::OK() : s;
}

}  // namespace tce
