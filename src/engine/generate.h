// generate.h: the single-sequence generation loop behind `k3 run` and `k3 chat`.
//
//   prefill   logits = step(prompt[n_cached:])                       (one call; the state holds the rest)
//   decode    repeat: id = sampler(logits, history)
//               id in stop_ids                  -> finish "stop" (the id is neither shown nor fed)
//               text = StopMatcher(StreamDecoder(id))  -> on_token(id, text)
//               a stop string completed         -> finish "stop" (the stop string and what follows dropped)
//               n_predict reached / context full -> finish "length"
//               logits = step({id})
//   end       the decoder's and matcher's held-back tail goes out as on_token(-1, tail)
//
// The model is reached only through StepFn, so the loop runs (and is tested) without a checkpoint.
// Stop strings are matched on detokenized text across token boundaries: text that could still be the
// start of a stop string is held back until it cannot (FORMATS.md §4.2, llama.cpp `--reverse-prompt`-like).
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"
#include "engine/sampler.h"
#include "io/tokenizer.h"

namespace k3 {

// Finds stop strings in a stream of text pieces, holding back any suffix that is a prefix of one.
class StopMatcher {
 public:
  explicit StopMatcher(std::vector<std::string> stops);  // empty strings are ignored
  // Adds text; returns what is now safe to emit. After a stop string completes, returns the text before
  // it, and every later push returns "".
  std::string push(std::string_view text);
  // End of stream: the held-back text (nothing after a stop).
  std::string flush();
  bool stopped() const { return stopped_; }
  // Which stop string matched ("" when none).
  const std::string& matched() const { return matched_; }

 private:
  std::vector<std::string> stops_;
  std::string held_;
  std::string matched_;
  bool stopped_ = false;
};

enum class FinishReason { stop, length, aborted };
const char* finish_reason_name(FinishReason r);  // "stop" | "length" | "aborted"

struct GenerateOptions {
  int n_predict = -1;    // most new tokens; -1 = until the context is full
  int64_t n_ctx = 4096;  // tokens the sequence may hold (prompt + generated ones fed back)
  int64_t n_cached = 0;  // leading prompt ids already in the state (< prompt size)
  std::vector<int32_t> stop_ids;
  std::vector<std::string> stop_strings;
};

struct GenerateResult {
  std::vector<int32_t> tokens;  // generated ids, a stop id excluded
  std::string text;             // everything passed to on_token, concatenated
  FinishReason finish = FinishReason::length;
  int32_t stop_id = -1;       // the stop id that ended generation, if one did
  int64_t n_prompt_eval = 0;  // ids fed by the prefill call
  int64_t n_decode_eval = 0;  // single-id decode calls
  double t_prompt_s = 0, t_decode_s = 0, t_sample_s = 0;
};

// Appends ids to the sequence and returns the last position's logits [n_vocab].
using StepFn = std::function<Status(std::span<const int32_t> ids, std::vector<float>* logits)>;
// One generated id and the text that became safe to show (possibly empty); id = -1 for the final tail.
// Returning false stops generation (FinishReason::aborted).
using TokenFn = std::function<bool(int32_t id, std::string_view text)>;

Result<GenerateResult> generate(const StepFn& step, const Tokenizer& tok, std::span<const int32_t> prompt,
                                const GenerateOptions& opt, Sampler& sampler, const TokenFn& on_token);

// The prompt that fits the context: unchanged when prompt.size() < n_ctx; otherwise an invalid_argument
// naming both sizes, or with `truncate` the last n_ctx - reserve ids (reserve = n_predict clamped to
// [1, n_ctx / 2], n_ctx / 2 when n_predict < 0), keeping room to generate.
Result<std::vector<int32_t>> fit_to_context(std::vector<int32_t> prompt, int64_t n_ctx, int n_predict,
                                            bool truncate);

}  // namespace k3
