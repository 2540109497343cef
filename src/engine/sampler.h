// sampler.h: pick the next token from one row of logits [n_vocab].
//
// The chain, in llama.cpp's default order (so `--top-p` means what llama.cpp users expect):
//   1. logit_bias       z[i] += bias[i]
//   2. penalties        over the last `repeat_last_n` ids of `history` (-1 = all of it, 0 = none), with
//                       c[i] = count of i in that window:
//                         repeat:   z[i] = z[i] > 0 ? z[i] / repeat_penalty : z[i] * repeat_penalty   (c[i] >
//                         0) OpenAI:   z[i] -= c[i] * frequency_penalty + (c[i] > 0) * presence_penalty
//   3. temperature <= 0 -> greedy: argmax z, ties -> the lowest id. Otherwise:
//   4. top_k            keep the k largest z (0 = off); order by z descending, ties by id ascending
//   5. top_p            p = softmax(z) over the kept set; keep the shortest prefix whose mass reaches top_p
//                       (the token that crosses the boundary is kept; 1 = off)
//   6. min_p            keep i with p[i] >= min_p * max p  (0 = off)
//   7. temperature      p = softmax(z / T) over the kept set, then one draw u in [0, 1) from
//   mt19937_64(seed):
//                       the first i (in candidate order) whose cumulative p exceeds u.
// At least one token always survives. logprobs, when asked, are of the model's distribution
// (log_softmax of the raw logits, before bias, penalties and truncation), as vLLM reports them.
#pragma once

#include <cstdint>
#include <random>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "core/status.h"

namespace k3 {

struct SamplerParams {
  float temperature = 1.0f;     // 0 = greedy
  int top_k = 0;                // 0 = off
  float top_p = 1.0f;           // 1 = off
  float min_p = 0.0f;           // 0 = off
  float repeat_penalty = 1.0f;  // 1 = off
  int repeat_last_n = 64;       // window of `history` the penalties see; -1 = all, 0 = none
  float presence_penalty = 0.0f;
  float frequency_penalty = 0.0f;
  std::vector<std::pair<int32_t, float>> logit_bias;  // (id, bias); -inf bans a token
  uint64_t seed = 0;
  int n_top_logprobs = 0;  // how many alternatives SampleResult::top carries (0..20)
};

// Checks ranges (temperature >= 0, top_p in (0, 1], min_p in [0, 1], repeat_penalty > 0, ...).
Status validate(const SamplerParams& p, int32_t n_vocab);

struct TokenLogprob {
  int32_t id = -1;
  float logprob = 0.f;
};

struct SampleResult {
  int32_t id = -1;
  float logprob = 0.f;            // of `id` under log_softmax(raw logits)
  std::vector<TokenLogprob> top;  // n_top_logprobs best, logprob descending, ties by id
};

class Sampler {
 public:
  explicit Sampler(SamplerParams params);

  const SamplerParams& params() const { return params_; }
  void reseed(uint64_t seed) { rng_.seed(seed); }

  // logits: [n_vocab] raw model output; history: ids the penalties look at (prompt + generated so far).
  // Returns the chosen id; fills *out (logprob, top alternatives) when given.
  int32_t sample(std::span<const float> logits, std::span<const int32_t> history,
                 SampleResult* out = nullptr);

  // Steps 1-2 only, in place (exposed for tests and for the server's logprob reporting).
  void apply_bias_and_penalties(std::span<float> z, std::span<const int32_t> history) const;

 private:
  // The next uniform double in [0, 1) from the 53 high bits of one mt19937_64 draw (portable).
  double next_uniform();

  SamplerParams params_;
  std::mt19937_64 rng_;
  std::vector<float> z_;                         // [n_vocab] scratch: processed logits
  std::vector<std::pair<float, int32_t>> cand_;  // candidates (z, id)
};

// log_softmax(logits)[id] for one row; and the k best (logprob descending, ties by id).
float token_logprob(std::span<const float> logits, int32_t id);
std::vector<TokenLogprob> top_logprobs(std::span<const float> logits, int k);

}  // namespace k3
