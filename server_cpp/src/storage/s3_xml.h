// Reading what an S3 server sends back without trusting it: fields of the
// small XML documents S3 answers with (errors, listings, multipart results),
// strict numbers, ETags, and text made safe to put in an error message.
//
// Not a general XML parser. S3's documents are flat records of elements, so
// a field is found by its tag; nothing here reads past the text it is given,
// so a hostile body costs at most its (already bounded) length. Stateless
// functions: thread-safe.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace tce {

// The text of the first element <tag>...</tag> (or <tag/>: empty) in `doc`,
// entities decoded. False when there is none or it is malformed.
bool XmlField(std::string_view doc, std::string_view tag, std::string* out);

// The raw contents of every element <tag>...</tag> in `doc`, in order. False
// when one is not closed or there are more than `max` (a listing page that
// claims more entries than S3 ever sends is hostile, not a big page).
bool XmlElements(std::string_view doc, std::string_view tag, size_t max, std::vector<std::string_view>* out);

// The name of the document's root element ("Error", "ListBucketResult"),
// past the XML declaration and leading whitespace (S3 sends spaces while a
// slow CompleteMultipartUpload works, to keep the connection alive). Empty
// when the document has no element.
std::string XmlRoot(std::string_view doc);

// Decodes the five named entities and numeric references; false on any
// other `&` (S3 sends no others) or a reference outside Unicode.
bool XmlUnescape(std::string_view raw, std::string* out);
// `text` as an XML text node: & < > " ' escaped.
std::string XmlEscape(std::string_view text);

// A decimal number of 1 to 20 digits that fits 64 bits, nothing else (no
// sign, no spaces).
bool ParseDecimal(std::string_view text, uint64_t* out);

// An ETag as S3 gives it (in quotes) without its quotes. False unless what
// remains is 1 to 256 printable ASCII characters other than `"`: such a
// value is sent back in If-Match and in CompleteMultipartUpload's XML.
bool CleanEtag(std::string_view raw, std::string* out);

// `text` for an error message: at most `max` characters, anything but
// printable ASCII written as \xNN, "..." where it was cut.
std::string Printable(std::string_view text, size_t max = 256);

// Seconds since the Unix epoch of an HTTP date ("Sun, 06 Nov 1994 08:49:37
// GMT", RFC 9110's IMF-fixdate, the one S3 sends) or of an ISO-8601 UTC
// time as S3 lists it ("2024-05-01T10:00:00.000Z", fraction optional).
// False for anything else (a date before 1970 or after 9999 included).
bool ParseHttpDate(std::string_view text, int64_t* unix_s);
bool ParseIsoTime(std::string_view text, int64_t* unix_s);

}  // namespace tce
