// tokenizer.h: the Kimi tiktoken BPE (FORMATS.md §1): tiktoken.model ranks, the Kimi pat_str (PCRE2,
// UTF + JIT), 256 reserved special ids after the base vocabulary named by tokenizer_config.json.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"

namespace k3 {

class Tokenizer {
 public:
  // Reads DIR/tiktoken.model and DIR/tokenizer_config.json.
  static Result<std::unique_ptr<Tokenizer>> open(const std::string& dir);
  virtual ~Tokenizer() = default;

  // allow_special: special spellings in `text` ("<|im_end|>") become their ids; otherwise plain BPE.
  // Invalid UTF-8 in `text` is first replaced as Python's bytes.decode("utf-8", "replace") does
  // (docs/decisions.md tok.1); long inputs are cut by the Kimi guard (FORMATS.md §1.1). Thread-safe.
  virtual std::vector<int32_t> encode(std::string_view text, bool allow_special = false) const = 0;
  // Concatenated token bytes (may end inside a UTF-8 character); specials render as their names;
  // ids outside [0, n_vocab) render as nothing (token_bytes returns "").
  virtual std::string decode(const std::vector<int32_t>& ids) const = 0;
  virtual std::string token_bytes(int32_t id) const = 0;

  virtual int32_t n_vocab() const = 0;           // base ranks + 256 reserved
  virtual int32_t n_base() const = 0;            // number of BPE ranks; specials start here
  virtual bool is_special(int32_t id) const = 0;
  // Id of a special token by name ("<|open|>"), if the tokenizer has it.
  virtual std::optional<int32_t> special_id(std::string_view name) const = 0;
};

// Streaming detokenizer: feed ids one by one, get back only complete UTF-8 characters.
class StreamDecoder {
 public:
  explicit StreamDecoder(const Tokenizer& tok) : tok_(tok) {}
  // Text that became complete with this token (possibly empty).
  std::string push(int32_t id);
  // Whatever is left at the end (an invalid tail is emitted as U+FFFD).
  std::string flush();

 private:
  const Tokenizer& tok_;
  std::string pending_;
};

}  // namespace k3
