// utf8.h: the UTF-8 rules the tokenizer shares with Python (FORMATS.md §1.1).
//
// sanitize(bytes) == Python bytes.decode("utf-8", errors="replace").encode(): each maximal subpart of an
// ill-formed sequence (Unicode §3.9, "U+FFFD substitution of maximal subparts", the CPython decoder's rule)
// becomes one U+FFFD. Examples: "\xE4\xB8" (truncated 中) -> one U+FFFD; "\xED\xA0\x80" (a surrogate) -> three;
// "\xC0\xAF" (overlong) -> two; "\xF4\x90\x80\x80" (> U+10FFFF) -> four.
//
// python_isspace(cp) == Python 3.11 str.isspace() (bidi class WS/B/S or category Zs), used by the long-input
// guard; it differs from the regex \s (Unicode White_Space) at U+001C..U+001F.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

namespace k3::utf8 {

// One scanned sequence at some offset: `len` bytes; `valid` = a complete well-formed character;
// `truncated` = ill-formed only because the input ended (could still become valid with more bytes).
struct Seq {
  int len;
  bool valid;
  bool truncated;
};

Seq scan(std::string_view s, size_t i);
bool is_valid(std::string_view s);
std::string sanitize(std::string_view s);
// Decodes the character at s[i] of a *valid* string and advances i past it.
char32_t next(std::string_view s, size_t& i);
void append(std::string& out, char32_t cp);
bool python_isspace(char32_t cp);

inline constexpr std::string_view kReplacement = "\xEF\xBF\xBD";  // U+FFFD

}  // namespace k3::utf8
