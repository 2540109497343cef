// utf8.cpp: well-formed UTF-8 per Unicode Table 3-7, Python-compatible replacement. See utf8.h.
#include "io/utf8.h"

#include <cstdint>

namespace k3::utf8 {

Seq scan(std::string_view s, size_t i) {
  const uint8_t b0 = static_cast<uint8_t>(s[i]);
  if (b0 < 0x80) return {1, true, false};
  int need = 0;                 // continuation bytes after the lead
  uint8_t lo = 0x80, hi = 0xBF;  // allowed range of the first continuation byte (Table 3-7)
  if (b0 >= 0xC2 && b0 <= 0xDF) {
    need = 1;
  } else if (b0 >= 0xE0 && b0 <= 0xEF) {
    need = 2;
    if (b0 == 0xE0) lo = 0xA0;  // no overlongs
    if (b0 == 0xED) hi = 0x9F;  // no surrogates
  } else if (b0 >= 0xF0 && b0 <= 0xF4) {
    need = 3;
    if (b0 == 0xF0) lo = 0x90;  // no overlongs
    if (b0 == 0xF4) hi = 0x8F;  // <= U+10FFFF
  } else {
    return {1, false, false};  // 80..C1, F5..FF never start a character
  }
  int k = 1;
  for (int j = 0; j < need; ++j, ++k) {
    if (i + k >= s.size()) return {k, false, true};
    const uint8_t b = static_cast<uint8_t>(s[i + k]);
    if (b < lo || b > hi) return {k, false, false};
    lo = 0x80;
    hi = 0xBF;
  }
  return {k, true, false};
}

bool is_valid(std::string_view s) {
  for (size_t i = 0; i < s.size();) {
    if (static_cast<uint8_t>(s[i]) < 0x80) {
      ++i;
      continue;
    }
    const Seq q = scan(s, i);
    if (!q.valid) return false;
    i += q.len;
  }
  return true;
}

std::string sanitize(std::string_view s) {
  std::string out;
  out.reserve(s.size() + 8);
  for (size_t i = 0; i < s.size();) {
    const Seq q = scan(s, i);
    if (q.valid)
      out.append(s.substr(i, q.len));
    else
      out.append(kReplacement);
    i += q.len;
  }
  return out;
}

char32_t next(std::string_view s, size_t& i) {
  const uint8_t b0 = static_cast<uint8_t>(s[i]);
  if (b0 < 0x80) return ++i, b0;
  const int len = b0 >= 0xF0 ? 4 : b0 >= 0xE0 ? 3 : 2;
  char32_t cp = b0 & (0x7F >> len);
  for (int k = 1; k < len && i + k < s.size(); ++k) cp = (cp << 6) | (static_cast<uint8_t>(s[i + k]) & 0x3F);
  i += len;
  return cp;
}

void append(std::string& out, char32_t cp) {
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xC0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += static_cast<char>(0xE0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (cp >> 18));
    out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  }
}

bool python_isspace(char32_t c) {
  // Python 3.11 (Unicode 14.0): [c for c in range(0x110000) if chr(c).isspace()].
  if (c <= 0x20) return (c >= 0x09 && c <= 0x0D) || (c >= 0x1C && c <= 0x20);
  if (c < 0x85) return false;
  return c == 0x85 || c == 0xA0 || c == 0x1680 || (c >= 0x2000 && c <= 0x200A) || c == 0x2028 ||
         c == 0x2029 || c == 0x202F || c == 0x205F || c == 0x3000;
}

}  // namespace k3::utf8
