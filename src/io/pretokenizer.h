// pretokenizer.h: the Kimi pat_str (FORMATS.md §1.2) on PCRE2 (8-bit, UTF + UCP, JIT), and the long-input
// guard (FORMATS.md §1.1) that cuts text before it.
//
// pat_str, eight alternatives, leftmost-first:
//   1 [\p{Han}]+
//   2 [^\r\n\p{L}\p{N}]?[Lu Lt Lm Lo M -Han]*[Ll Lm Lo M -Han]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?
//   3 [^\r\n\p{L}\p{N}]?[Lu Lt Lm Lo M -Han]+[Ll Lm Lo M -Han]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?
//   4 \p{N}{1,3}    5 ␠?[^\s\p{L}\p{N}]+[\r\n]*    6 \s*[\r\n]+    7 \s+(?!\S)    8 \s+
// Rewrites for PCRE2 (no `&&`): "[X&&[^\p{Han}]]" = (?:(?!HAN)[X]); \p{Han} = the pinned ranges of
// FORMATS.md (Unicode 15.1 Script=Han); \s = Unicode White_Space listed explicitly (PCRE2's UCP \s also takes
// U+180E). L/M/N come from PCRE2's own tables (its Unicode version: unicode_version()).
//
// Guard: windows of <= 400,000 code points; inside each, a run of same-class characters (Python isspace())
// longer than 25,000 is cut before the character that would exceed it; slices are encoded independently.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"

namespace k3 {

class Pretokenizer {
 public:
  static Result<Pretokenizer> create();

  // Calls on_piece for every pat_str match of `text` (valid UTF-8), in order. Characters no alternative
  // matches are skipped, as tiktoken's findall does (the pattern covers every character, so none are).
  void split(std::string_view text, const std::function<void(std::string_view)>& on_piece) const;

  static std::string pattern();          // the PCRE2 source of pat_str
  static std::string unicode_version();  // PCRE2's Unicode tables, e.g. "14.0.0"

 private:
  std::shared_ptr<void> code_;  // pcre2_code_8*, shared and immutable after compile (thread-safe matching)
  bool jit_ = false;
};

inline constexpr size_t kMaxEncodeChars = 400'000;   // TIKTOKEN_MAX_ENCODE_CHARS
inline constexpr size_t kMaxRunChars = 25'000;       // MAX_NO_WHITESPACES_CHARS

// The guard's slices of `text` (valid UTF-8) as views into it; an empty text gives one empty slice.
std::vector<std::string_view> guard_slices(std::string_view text, size_t max_window = kMaxEncodeChars,
                                           size_t max_run = kMaxRunChars);

}  // namespace k3
