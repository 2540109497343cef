// fuzz_tokenizer.cpp: arbitrary bytes -> encode -> decode (FORMATS.md §1).
// Input: byte 0 = flags (bit 0: allow_special), the rest = text. Invariants, for any bytes:
//   every id is in [0, n_vocab); no special id unless allowed;
//   decode(encode(text)) == sanitize(text)   (= text when it is valid UTF-8; specials render as their names)
//   StreamDecoder over the ids, then flush, == the same string, and every push is valid UTF-8;
//   the long-input guard's slices (small limits here) concatenate back to the text.
// Tokenizer: $K3_FUZZ_TOKENIZER or tests/data/tokenizer-test next to this file.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "io/pretokenizer.h"
#include "io/tokenizer.h"
#include "io/utf8.h"

namespace {

const k3::Tokenizer& tokenizer() {
  static std::unique_ptr<k3::Tokenizer> tok = [] {
    const char* env = std::getenv("K3_FUZZ_TOKENIZER");
    const std::string here = __FILE__;  // <root>/fuzz/fuzz_tokenizer.cpp (absolute in CMake builds)
    const size_t cut = here.rfind("fuzz/");
    std::string dir = env ? env : (cut == 0 ? "." : here.substr(0, cut)) + "/tests/data/tokenizer-test";
    auto r = k3::Tokenizer::open(dir);
    if (!r.ok()) {
      std::fprintf(stderr, "fuzz_tokenizer: %s\n", r.status().message().c_str());
      std::abort();
    }
    return std::move(r.value());
  }();
  return *tok;
}

void check(bool ok, const char* what) {
  if (!ok) {
    std::fprintf(stderr, "fuzz_tokenizer: invariant failed: %s\n", what);
    std::abort();
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const k3::Tokenizer& tok = tokenizer();
  const bool allow_special = data[0] & 1;
  const std::string text(reinterpret_cast<const char*>(data) + 1, size - 1);
  const std::string clean = k3::utf8::sanitize(text);

  const std::vector<int32_t> ids = tok.encode(text, allow_special);
  for (int32_t id : ids) {
    check(id >= 0 && id < tok.n_vocab(), "id in range");
    check(allow_special || !tok.is_special(id), "no special ids unless allowed");
  }
  check(tok.decode(ids) == clean, "decode(encode(text)) == sanitize(text)");

  k3::StreamDecoder stream(tok);
  std::string streamed;
  for (int32_t id : ids) {
    std::string piece = stream.push(id);
    check(k3::utf8::is_valid(piece), "stream pushes are valid UTF-8");
    streamed += piece;
  }
  streamed += stream.flush();
  check(streamed == clean, "streamed == sanitize(text)");

  std::string joined;
  for (std::string_view s : k3::guard_slices(clean, 7, 3)) joined += s;
  check(joined == clean, "guard slices concatenate to the text");
  return 0;
}
