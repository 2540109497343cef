// batch.h: the bookkeeping of forward_batch, shared by the CPU model (model.cpp) and the GPU model
// (gpu/model_gpu.cu): token checks, packing the sequences that have tokens, and handing each sequence its
// last row of logits.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "core/status.h"
#include "core/thread_pool.h"

namespace k3 {

// Every id in [0, n_vocab), else a Status naming the first bad one and its position.
Status check_tokens(const int32_t* tokens, int64_t n, int64_t n_vocab);

// The sequences with tokens, packed: live[i] owns rows [row0[i], row0[i+1]) of `tokens`; its last row is
// out_rows[i].
template <class State>
struct PackedBatch {
  std::vector<int32_t> tokens;
  std::vector<int64_t> row0 = {0}, out_rows;
  std::vector<State*> live;
};

// Checks every span (ids in range, as many spans as states, no state twice with tokens) and packs them.
template <class State>
Status pack_batch(std::span<State*> states, std::span<const std::span<const int32_t>> tokens, int64_t n_vocab,
                  PackedBatch<State>* b) {
  if (states.size() != tokens.size())
    return error(Code::invalid_argument, "forward_batch: " + std::to_string(states.size()) + " states but " +
                                             std::to_string(tokens.size()) + " token spans");
  for (size_t i = 0; i < states.size(); ++i) {
    Status s = check_tokens(tokens[i].data(), int64_t(tokens[i].size()), n_vocab);
    if (!s.ok()) return s.with_context("sequence " + std::to_string(i));
    for (size_t j = 0; j < i; ++j)
      if (states[j] == states[i] && !tokens[i].empty())
        return error(Code::invalid_argument, "forward_batch: one state appears twice");
    if (tokens[i].empty()) continue;
    b->tokens.insert(b->tokens.end(), tokens[i].begin(), tokens[i].end());
    b->live.push_back(states[i]);
    b->row0.push_back(int64_t(b->tokens.size()));
    b->out_rows.push_back(int64_t(b->tokens.size()) - 1);
  }
  return ok_status();
}

// last_logits[i] = row k of logits [n_live, n_vocab] for the k-th sequence with tokens, empty for a sequence
// without. The caller's vectors keep their capacity across calls: no allocation in steady state. pool: the
// rows are copied by its threads (a B = 64 step of K3 hands out 42 MB).
void unpack_last_logits(std::span<const std::span<const int32_t>> tokens, const float* logits,
                        int64_t n_vocab, std::vector<std::vector<float>>* last_logits,
                        ThreadPool* pool = nullptr);

}  // namespace k3
