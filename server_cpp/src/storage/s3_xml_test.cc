#include "storage/s3_xml.h"

#include <gtest/gtest.h>

#include "storage/s3_http.h"

namespace tce {
namespace {

TEST(S3Xml, FieldsByTagNotByPrefix) {
  const std::string doc =
      "<?xml version=\"1.0\"?><ListMultipartUploadsResult><KeyMarker>m</KeyMarker><Upload><Key>a&amp;b</Key>"
      "<UploadId>u1</UploadId><Initiator><ID>x</ID></Initiator></Upload><Prefix/></ListMultipartUploadsResult>";
  std::string out;
  ASSERT_TRUE(XmlField(doc, "Key", &out));
  EXPECT_EQ(out, "a&b");
  ASSERT_TRUE(XmlField(doc, "KeyMarker", &out));
  EXPECT_EQ(out, "m");
  ASSERT_TRUE(XmlField(doc, "Prefix", &out));
  EXPECT_EQ(out, "");
  EXPECT_FALSE(XmlField(doc, "Missing", &out));
  EXPECT_FALSE(XmlField("<Key>never closed", "Key", &out));
}

TEST(S3Xml, ElementsAreBoundedAndClosed) {
  std::vector<std::string_view> out;
  ASSERT_TRUE(XmlElements("<R><C><K>1</K></C><C><K>2</K></C></R>", "C", 10, &out));
  ASSERT_EQ(out.size(), 2u);
  EXPECT_EQ(out[1], "<K>2</K>");
  EXPECT_FALSE(XmlElements("<C>1</C><C>2</C><C>3</C>", "C", 2, &out));
  EXPECT_FALSE(XmlElements("<C>1</C><C>2", "C", 10, &out));
  ASSERT_TRUE(XmlElements("<R><Contents/></R>", "Contents", 10, &out));
  EXPECT_EQ(out.size(), 1u);
}

TEST(S3Xml, RootSkipsDeclarationAndKeepAliveSpaces) {
  EXPECT_EQ(XmlRoot("   \n  <?xml version=\"1.0\"?>\n<Error><Code>InternalError</Code></Error>"), "Error");
  EXPECT_EQ(XmlRoot("<CompleteMultipartUploadResult xmlns=\"x\"><ETag/></CompleteMultipartUploadResult>"),
            "CompleteMultipartUploadResult");
  EXPECT_EQ(XmlRoot("not xml"), "");
}

TEST(S3Xml, UnescapeIsStrict) {
  std::string out;
  ASSERT_TRUE(XmlUnescape("&lt;&gt;&quot;&apos;&amp;&#65;&#x42;&#xe9;", &out));
  EXPECT_EQ(out, "<>\"'&AB\xc3\xa9");
  EXPECT_FALSE(XmlUnescape("&nbsp;", &out));
  EXPECT_FALSE(XmlUnescape("a & b", &out));
  EXPECT_FALSE(XmlUnescape("&#0;", &out));
  EXPECT_FALSE(XmlUnescape("&#x110000;", &out));
  EXPECT_FALSE(XmlUnescape("&#xD800;", &out));
  EXPECT_EQ(XmlEscape("a<b>&\"'"), "a&lt;b&gt;&amp;&quot;&apos;");
}

TEST(S3Xml, DecimalsAreStrict) {
  uint64_t v = 0;
  ASSERT_TRUE(ParseDecimal("18446744073709551615", &v));
  EXPECT_EQ(v, UINT64_MAX);
  EXPECT_FALSE(ParseDecimal("18446744073709551616", &v));
  EXPECT_FALSE(ParseDecimal("", &v));
  EXPECT_FALSE(ParseDecimal("-1", &v));
  EXPECT_FALSE(ParseDecimal(" 1", &v));
  EXPECT_FALSE(ParseDecimal("1e3", &v));
  EXPECT_FALSE(ParseDecimal("0x10", &v));
}

TEST(S3Xml, EtagsLoseQuotesAndMustBePrintable) {
  std::string out;
  ASSERT_TRUE(CleanEtag("\"d41d8cd98f00b204e9800998ecf8427e\"", &out));
  EXPECT_EQ(out, "d41d8cd98f00b204e9800998ecf8427e");
  ASSERT_TRUE(CleanEtag("abc-3", &out));
  EXPECT_EQ(out, "abc-3");
  EXPECT_FALSE(CleanEtag("\"\"", &out));
  EXPECT_FALSE(CleanEtag("a\r\nX-Injected: 1", &out));
  EXPECT_FALSE(CleanEtag("a\"b", &out));
  EXPECT_FALSE(CleanEtag(std::string(300, 'a'), &out));
}

TEST(S3Xml, PrintableEscapesAndBounds) {
  EXPECT_EQ(Printable("a\nb\x01\\"), "a\\x0ab\\x01\\x5c");
  EXPECT_EQ(Printable(std::string(10, 'x'), 4), "xxxx...");
}

TEST(S3Xml, ReadsTheTimesS3Sends) {
  int64_t t = 0;
  ASSERT_TRUE(ParseHttpDate("Sun, 06 Nov 1994 08:49:37 GMT", &t));
  EXPECT_EQ(t, 784111777);
  ASSERT_TRUE(ParseIsoTime("2024-02-29T23:59:59.123Z", &t));
  EXPECT_EQ(t, 1709251199);
  ASSERT_TRUE(ParseIsoTime("1994-11-06T08:49:37Z", &t));
  EXPECT_EQ(t, 784111777);
  for (const char* bad : {"", "Sun, 06 Nov 1994 08:49:37 UTC", "Sun, 06 Foo 1994 08:49:37 GMT",
                          "Sun, 32 Nov 1994 08:49:37 GMT", "Sun,  6 Nov 1994 08:49:37 GMT"})
    EXPECT_FALSE(ParseHttpDate(bad, &t)) << bad;
  for (const char* bad : {"2024-02-29T23:59:59", "2024-13-01T00:00:00Z", "1969-12-31T23:59:59Z",
                          "2024-02-29T24:00:00Z", "2024-02-29T23:59:59.Z", "2024-02-29T23:59:59.1234567890Z",
                          "2024-02-29 23:59:59Z", "20x4-02-29T23:59:59Z"})
    EXPECT_FALSE(ParseIsoTime(bad, &t)) << bad;
}

TEST(S3Url, EncodesAsSigV4Wants) {
  EXPECT_EQ(S3UriEncode("a b/c~d_e.f-g", true), "a%20b/c~d_e.f-g");
  EXPECT_EQ(S3UriEncode("a b/c", false), "a%20b%2Fc");
  EXPECT_EQ(S3UriEncode("+*=&?%\xc3\xa9", false), "%2B%2A%3D%26%3F%25%C3%A9");
}

TEST(S3Url, QueriesAreSortedWithEveryEquals) {
  EXPECT_EQ(S3Query({{"uploads", ""}, {"prefix", "a/b"}, {"upload-id-marker", "u"}, {"key-marker", "k"}}),
            "key-marker=k&prefix=a%2Fb&upload-id-marker=u&uploads=");
  EXPECT_EQ(S3Query({{"prefix", "J"}, {"list-type", "2"}, {"continuation-token", "t=="}}),
            "continuation-token=t%3D%3D&list-type=2&prefix=J");
  EXPECT_EQ(S3Query({{"uploadId", "x"}, {"partNumber", "3"}}), "partNumber=3&uploadId=x");
}

}  // namespace
}  // namespace tce
