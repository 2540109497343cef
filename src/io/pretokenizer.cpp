// pretokenizer.cpp: pat_str on PCRE2 and the long-input guard. See pretokenizer.h.
#define PCRE2_CODE_UNIT_WIDTH 8
#include "io/pretokenizer.h"

#include <pcre2.h>

#include <cstdio>

#include "core/log.h"
#include "io/utf8.h"

namespace k3 {
namespace {

// \p{Han} as pinned by FORMATS.md §1.2 (Unicode 15.1 Script=Han), independent of PCRE2's tables.
constexpr char32_t kHanRanges[][2] = {
    {0x2E80, 0x2E99},   {0x2E9B, 0x2EF3},   {0x2F00, 0x2FD5},   {0x3005, 0x3005},   {0x3007, 0x3007},
    {0x3021, 0x3029},   {0x3038, 0x303B},   {0x3400, 0x4DBF},   {0x4E00, 0x9FFF},   {0xF900, 0xFA6D},
    {0xFA70, 0xFAD9},   {0x16FE2, 0x16FE3}, {0x16FF0, 0x16FF1}, {0x20000, 0x2A6DF}, {0x2A700, 0x2B739},
    {0x2B740, 0x2B81D}, {0x2B820, 0x2CEA1}, {0x2CEB0, 0x2EBE0}, {0x2EBF0, 0x2EE5D}, {0x2F800, 0x2FA1D},
    {0x30000, 0x3134A}, {0x31350, 0x323AF}};

// Unicode White_Space (what Rust regex's \s means).
constexpr const char* kWhiteSpace =
    R"(\t-\r\x{20}\x{85}\x{A0}\x{1680}\x{2000}-\x{200A}\x{2028}\x{2029}\x{202F}\x{205F}\x{3000})";

std::string han_class_body() {
  std::string s;
  char buf[48];
  for (const auto& r : kHanRanges) {
    if (r[0] == r[1])
      std::snprintf(buf, sizeof buf, "\\x{%X}", static_cast<unsigned>(r[0]));
    else
      std::snprintf(buf, sizeof buf, "\\x{%X}-\\x{%X}", static_cast<unsigned>(r[0]), static_cast<unsigned>(r[1]));
    s += buf;
  }
  return s;
}

void free_code(void* p) { pcre2_code_free(static_cast<pcre2_code*>(p)); }

}  // namespace

std::string Pretokenizer::pattern() {
  const std::string han = "[" + han_class_body() + "]";
  const std::string ws = std::string("[") + kWhiteSpace + "]";
  const std::string not_ws = std::string("[^") + kWhiteSpace + "]";
  const std::string upper = "(?:(?!" + han + ")[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}])";
  const std::string lower = "(?:(?!" + han + ")[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}])";
  const std::string contraction = "(?i:'s|'t|'re|'ve|'m|'ll|'d)?";
  const std::string lead = "[^\\r\\n\\p{L}\\p{N}]?";
  return han + "+" +                                                             // 1
         "|" + lead + upper + "*" + lower + "+" + contraction +                  // 2
         "|" + lead + upper + "+" + lower + "*" + contraction +                  // 3
         "|\\p{N}{1,3}" +                                                        // 4
         "|\\x{20}?[^" + kWhiteSpace + "\\p{L}\\p{N}]+[\\r\\n]*" +               // 5
         "|" + ws + "*[\\r\\n]+" +                                               // 6
         "|" + ws + "+(?!" + not_ws + ")" +                                      // 7
         "|" + ws + "+";                                                         // 8
}

std::string Pretokenizer::unicode_version() {
  char buf[32] = {0};
  pcre2_config(PCRE2_CONFIG_UNICODE_VERSION, buf);
  return buf;
}

Result<Pretokenizer> Pretokenizer::create() {
  const std::string pat = pattern();
  int err = 0;
  PCRE2_SIZE err_off = 0;
  pcre2_code* code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pat.data()), pat.size(), PCRE2_UTF | PCRE2_UCP,
                                   &err, &err_off, nullptr);
  if (!code) {
    PCRE2_UCHAR msg[256];
    pcre2_get_error_message(err, msg, sizeof msg);
    return error(Code::internal, "pat_str does not compile at offset " + std::to_string(err_off) + ": " +
                                     reinterpret_cast<char*>(msg));
  }
  Pretokenizer p;
  p.code_ = std::shared_ptr<void>(code, free_code);
  p.jit_ = pcre2_jit_compile(code, PCRE2_JIT_COMPLETE) == 0;
  if (!p.jit_) K3_LOG_WARN("tokenizer: PCRE2 JIT unavailable, using the interpreter");
  return p;
}

void Pretokenizer::split(std::string_view text, const std::function<void(std::string_view)>& on_piece) const {
  auto* code = static_cast<pcre2_code*>(code_.get());
  // Per-call scratch: match data and a JIT stack large enough for a 25,000-character piece.
  std::unique_ptr<pcre2_match_data, void (*)(pcre2_match_data*)> md(pcre2_match_data_create(1, nullptr),
                                                                      pcre2_match_data_free);
  std::unique_ptr<pcre2_match_context, void (*)(pcre2_match_context*)> mc(pcre2_match_context_create(nullptr),
                                                                          pcre2_match_context_free);
  std::unique_ptr<pcre2_jit_stack, void (*)(pcre2_jit_stack*)> stack(nullptr, pcre2_jit_stack_free);
  if (jit_ && text.size() > 256) {
    stack.reset(pcre2_jit_stack_create(64 * 1024, 64 << 20, nullptr));
    if (stack) pcre2_jit_stack_assign(mc.get(), nullptr, stack.get());
  }
  pcre2_set_heap_limit(mc.get(), 1 << 20);  // KiB, for the interpreter fallback
  const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  size_t pos = 0;
  while (pos < text.size()) {
    const int rc = pcre2_match(code, subject, text.size(), pos, PCRE2_NO_UTF_CHECK, md.get(), mc.get());
    if (rc == PCRE2_ERROR_NOMATCH) break;
    if (rc < 0) {  // resource limit: never lose text; hand the rest to BPE as one piece
      K3_LOG_WARN("tokenizer: PCRE2 match error %d at byte %zu; encoding the rest as one piece", rc, pos);
      on_piece(text.substr(pos));
      break;
    }
    const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md.get());
    const size_t b = ov[0], e = ov[1];
    if (e <= b) {  // cannot happen (every alternative consumes a character); step one character
      size_t i = pos;
      utf8::next(text, i);
      pos = i;
      continue;
    }
    on_piece(text.substr(b, e - b));
    pos = e;
  }
}

std::vector<std::string_view> guard_slices(std::string_view text, size_t max_window, size_t max_run) {
  std::vector<std::string_view> out;
  size_t i = 0;
  do {
    // One window of <= max_window code points, scanned like Kimi's _split_whitespaces_or_nonwhitespaces.
    const size_t window_start = i;
    size_t n_chars = 0, run = 0, slice_start = i;
    bool run_is_space = false;
    while (i < text.size() && n_chars < max_window) {
      const size_t at = i;
      const bool space = utf8::python_isspace(utf8::next(text, i));
      if (at == window_start) run_is_space = space;
      if (space != run_is_space) {
        run = 1;
        run_is_space = space;
      } else if (++run > max_run) {
        out.push_back(text.substr(slice_start, at - slice_start));
        slice_start = at;
        run = 1;
      }
      ++n_chars;
    }
    out.push_back(text.substr(slice_start, i - slice_start));
  } while (i < text.size());
  return out;
}

}  // namespace k3
