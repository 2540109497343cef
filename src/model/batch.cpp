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
                        int64_t n_vocab, std::vector<std::vector<float>>* last_logits, ThreadPool* pool) {
  const size_t V = size_t(n_vocab);
  last_logits->resize(tokens.size());
  std::vector<int64_t> row(tokens.size(), -1);  // the logits row of sequence i, -1: none
  for (size_t i = 0, k = 0; i < tokens.size(); ++i)
    if (!tokens[i].empty()) row[i] = int64_t(k++);
  parallel_for(pool, int64_t(tokens.size()), [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i) {
      std::vector<float>& out = (*last_logits)[size_t(i)];
      if (row[size_t(i)] < 0)
        out.clear();
      else
        out.assign(logits + size_t(row[size_t(i)]) * V, logits + size_t(row[size_t(i)] + 1) * V);
    }
  });
}

}  // namespace k3
