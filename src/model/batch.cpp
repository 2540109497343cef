// batch.cpp: forward_batch's token check and logits hand-out (batch.h).
#include "model/batch.h"

namespace k3 {

Status check_tokens(const int32_t* tokens, int64_t n, int64_t n_vocab) {
  for (int64_t t = 0; t < n; ++t)
    if (tokens[t] < 0 || tokens[t] >= n_vocab)
      return error(Code::invalid_argument, "token id " + std::to_string(tokens[t]) + " at position " +
                                               std::to_string(t) + " is outside [0, " +
                                               std::to_string(n_vocab) + ")");
  return ok_status();
}

void unpack_last_logits(std::span<const std::span<const int32_t>> tokens, const float* logits,
                        int64_t n_vocab, std::vector<std::vector<float>>* last_logits) {
  const size_t V = size_t(n_vocab);
  last_logits->resize(tokens.size());
  for (size_t i = 0, k = 0; i < tokens.size(); ++i) {
    std::vector<float>& out = (*last_logits)[i];
    if (tokens[i].empty()) {
      out.clear();
      continue;
    }
    out.assign(logits + k * V, logits + (k + 1) * V);
    ++k;
  }
}

}  // namespace k3
