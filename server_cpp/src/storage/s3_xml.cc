#include "storage/s3_xml.h"

#include <cstdio>

namespace tce {
namespace {

// Where the element <tag ...> that starts at or after `from` begins (at its
// '<'), and where its start tag ends (past its '>'); `empty` for <tag/>.
bool FindStartTag(std::string_view doc, std::string_view tag, size_t from, size_t* begin, size_t* inner,
                  bool* empty) {
  while (from < doc.size()) {
    const size_t lt = doc.find('<', from);
    if (lt == std::string_view::npos) return false;
    from = lt + 1;
    if (doc.compare(lt + 1, tag.size(), tag) != 0) continue;
    const size_t after = lt + 1 + tag.size();
    if (after >= doc.size()) return false;
    const char c = doc[after];
    // <Key> and <Key attr=...> are the element; <KeyMarker> is another one.
    if (c != '>' && c != '/' && c != ' ' && c != '\t' && c != '\r' && c != '\n') continue;
    const size_t gt = doc.find('>', after);
    if (gt == std::string_view::npos) return false;
    *begin = lt;
    *inner = gt + 1;
    *empty = doc[gt - 1] == '/';
    return true;
  }
  return false;
}

// The contents of the element whose start tag ends at `inner`, and the
// position past its end tag.
bool FindEndTag(std::string_view doc, std::string_view tag, size_t inner, std::string_view* contents,
                size_t* next) {
  std::string end = "</";
  end.append(tag.data(), tag.size());
  end += '>';
  const size_t close = doc.find(end, inner);
  if (close == std::string_view::npos) return false;
  *contents = doc.substr(inner, close - inner);
  *next = close + end.size();
  return true;
}

void AppendUtf8(uint32_t cp, std::string* out) {
  if (cp < 0x80) {
    *out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    *out += static_cast<char>(0xC0 | (cp >> 6));
    *out += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    *out += static_cast<char>(0xE0 | (cp >> 12));
    *out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    *out += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    *out += static_cast<char>(0xF0 | (cp >> 18));
    *out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    *out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    *out += static_cast<char>(0x80 | (cp & 0x3F));
  }
}

bool ParseReference(std::string_view ref, uint32_t* cp) {
  const bool hex = !ref.empty() && (ref[0] == 'x' || ref[0] == 'X');
  if (hex) ref.remove_prefix(1);
  if (ref.empty() || ref.size() > 8) return false;
  uint32_t v = 0;
  for (char c : ref) {
    int d;
    if (c >= '0' && c <= '9') {
      d = c - '0';
    } else if (hex && c >= 'a' && c <= 'f') {
      d = c - 'a' + 10;
    } else if (hex && c >= 'A' && c <= 'F') {
      d = c - 'A' + 10;
    } else {
      return false;
    }
    v = v * (hex ? 16 : 10) + d;
    if (v > 0x10FFFF) return false;
  }
  if (v == 0 || (v >= 0xD800 && v <= 0xDFFF)) return false;
  *cp = v;
  return true;
}

}  // namespace

bool XmlField(std::string_view doc, std::string_view tag, std::string* out) {
  size_t begin, inner, next;
  bool empty;
  if (!FindStartTag(doc, tag, 0, &begin, &inner, &empty)) return false;
  if (empty) {
    out->clear();
    return true;
  }
  std::string_view contents;
  if (!FindEndTag(doc, tag, inner, &contents, &next)) return false;
  return XmlUnescape(contents, out);
}

bool XmlElements(std::string_view doc, std::string_view tag, size_t max, std::vector<std::string_view>* out) {
  out->clear();
  size_t from = 0, begin, inner;
  bool empty;
  while (FindStartTag(doc, tag, from, &begin, &inner, &empty)) {
    if (out->size() == max) return false;
    if (empty) {
      out->emplace_back();
      from = inner;
      continue;
    }
    std::string_view contents;
    if (!FindEndTag(doc, tag, inner, &contents, &from)) return false;
    out->push_back(contents);
  }
  return true;
}

std::string XmlRoot(std::string_view doc) {
  size_t pos = 0;
  while (pos < doc.size()) {
    const size_t lt = doc.find('<', pos);
    if (lt == std::string_view::npos || lt + 1 >= doc.size()) return "";
    const char c = doc[lt + 1];
    if (c == '?' || c == '!') {  // the declaration, a comment, a doctype
      const size_t gt = doc.find('>', lt);
      if (gt == std::string_view::npos) return "";
      pos = gt + 1;
      continue;
    }
    size_t end = lt + 1;
    while (end < doc.size() && doc[end] != '>' && doc[end] != '/' && doc[end] != ' ' && doc[end] != '\t' &&
           doc[end] != '\r' && doc[end] != '\n') {
      ++end;
    }
    return std::string(doc.substr(lt + 1, end - lt - 1));
  }
  return "";
}

bool XmlUnescape(std::string_view raw, std::string* out) {
  out->clear();
  out->reserve(raw.size());
  size_t pos = 0;
  while (pos < raw.size()) {
    const size_t amp = raw.find('&', pos);
    if (amp == std::string_view::npos) {
      out->append(raw.data() + pos, raw.size() - pos);
      break;
    }
    out->append(raw.data() + pos, amp - pos);
    const size_t semi = raw.find(';', amp);
    if (semi == std::string_view::npos || semi - amp > 12) return false;
    const std::string_view name = raw.substr(amp + 1, semi - amp - 1);
    if (name == "amp") {
      *out += '&';
    } else if (name == "lt") {
      *out += '<';
    } else if (name == "gt") {
      *out += '>';
    } else if (name == "quot") {
      *out += '"';
    } else if (name == "apos") {
      *out += '\'';
    } else {
      uint32_t cp;
      if (name.empty() || name[0] != '#' || !ParseReference(name.substr(1), &cp)) return false;
      AppendUtf8(cp, out);
    }
    pos = semi + 1;
  }
  return true;
}

std::string XmlEscape(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (char c : text) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&quot;"; break;
      case '\'': out += "&apos;"; break;
      default: out += c;
    }
  }
  return out;
}

bool ParseDecimal(std::string_view text, uint64_t* out) {
  if (text.empty() || text.size() > 20) return false;
  uint64_t v = 0;
  for (char c : text) {
    if (c < '0' || c > '9') return false;
    const uint64_t d = static_cast<uint64_t>(c - '0');
    if (v > (UINT64_MAX - d) / 10) return false;
    v = v * 10 + d;
  }
  *out = v;
  return true;
}

bool CleanEtag(std::string_view raw, std::string* out) {
  if (raw.size() >= 2 && raw.front() == '"' && raw.back() == '"') raw = raw.substr(1, raw.size() - 2);
  if (raw.empty() || raw.size() > 256) return false;
  for (char c : raw) {
    if (c < 0x21 || c > 0x7e || c == '"') return false;
  }
  out->assign(raw.data(), raw.size());
  return true;
}

std::string Printable(std::string_view text, size_t max) {
  std::string out;
  for (unsigned char c : text) {
    if (out.size() >= max) {
      out += "...";
      break;
    }
    if (c >= 0x20 && c < 0x7f && c != '\\') {
      out += static_cast<char>(c);
    } else {
      char esc[8];
      std::snprintf(esc, sizeof(esc), "\\x%02x", c);
      out += esc;
    }
  }
  return out;
}

namespace {

// Days from 1970-01-01 to y-m-d (proleptic Gregorian; Howard Hinnant's
// days_from_civil).
int64_t DaysFromCivil(int64_t y, unsigned m, unsigned d) {
  y -= m <= 2;
  const int64_t era = (y >= 0 ? y : y - 399) / 400;
  const unsigned yoe = static_cast<unsigned>(y - era * 400);
  const unsigned doy = (153 * (m + (m > 2 ? -3 : 9)) + 2) / 5 + d - 1;
  const unsigned doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
  return era * 146097 + static_cast<int64_t>(doe) - 719468;
}

// `n` digits at text[at..] as a number; false unless all are digits.
bool Digits(std::string_view text, size_t at, size_t n, unsigned* out) {
  if (at + n > text.size()) return false;
  unsigned v = 0;
  for (size_t i = at; i < at + n; ++i) {
    if (text[i] < '0' || text[i] > '9') return false;
    v = v * 10 + static_cast<unsigned>(text[i] - '0');
  }
  *out = v;
  return true;
}

bool Civil(unsigned y, unsigned mo, unsigned d, unsigned h, unsigned mi, unsigned s, int64_t* unix_s) {
  static const unsigned kDays[] = {31, 29, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31};
  if (y < 1970 || mo < 1 || mo > 12 || d < 1 || d > kDays[mo - 1] || h > 23 || mi > 59 || s > 60) return false;
  *unix_s = DaysFromCivil(y, mo, d) * 86400 + h * 3600 + mi * 60 + s;
  return true;
}

}  // namespace

bool ParseHttpDate(std::string_view text, int64_t* unix_s) {
  // "Sun, 06 Nov 1994 08:49:37 GMT"
  static const char* kMonths[] = {"Jan", "Feb", "Mar", "Apr", "May", "Jun",
                                  "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"};
  if (text.size() != 29 || text.substr(3, 2) != ", " || text[7] != ' ' || text[11] != ' ' || text[16] != ' ' ||
      text[19] != ':' || text[22] != ':' || text.substr(25) != " GMT")
    return false;
  unsigned mo = 0;
  for (unsigned i = 0; i < 12; ++i)
    if (text.substr(8, 3) == kMonths[i]) mo = i + 1;
  unsigned d, y, h, mi, s;
  return mo != 0 && Digits(text, 5, 2, &d) && Digits(text, 12, 4, &y) && Digits(text, 17, 2, &h) &&
         Digits(text, 20, 2, &mi) && Digits(text, 23, 2, &s) && Civil(y, mo, d, h, mi, s, unix_s);
}

bool ParseIsoTime(std::string_view text, int64_t* unix_s) {
  // "2024-05-01T10:00:00.000Z"
  if (text.size() < 20 || text.size() > 40 || text[4] != '-' || text[7] != '-' || text[10] != 'T' ||
      text[13] != ':' || text[16] != ':' || text.back() != 'Z')
    return false;
  if (text.size() > 20) {  // a fraction of a second
    unsigned ignored;
    if (text[19] != '.' || text.size() == 21 || !Digits(text, 20, text.size() - 21, &ignored) ||
        text.size() - 21 > 9)
      return false;
  }
  unsigned y, mo, d, h, mi, s;
  return Digits(text, 0, 4, &y) && Digits(text, 5, 2, &mo) && Digits(text, 8, 2, &d) && Digits(text, 11, 2, &h) &&
         Digits(text, 14, 2, &mi) && Digits(text, 17, 2, &s) && Civil(y, mo, d, h, mi, s, unix_s);
}

}  // namespace tce
