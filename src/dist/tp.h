// tp.h: tensor parallelism applied to a bound model from outside (gpt-fast tp.py's apply_tp idea).
//
// Rank r of n keeps 1/n of the heads of every attention block and 1/n of the width of every dense GLU:
//   KDA     heads [r H/n, (r+1) H/n): q/k/v/f_b/g(_b)/b_proj rows, conv taps, dt_bias, A_log sliced;
//           o_proj columns sliced (row-parallel: its output is a partial sum, reduced over ranks)
//   MLA     heads likewise: q_proj | q_b_proj rows, kv_b_proj rows (both paths), g_proj rows, o_proj columns;
//           the 576-wide latent (kv_a_proj_with_mqa) and q_a_proj stay replicated, so every rank keeps the
//           whole latent cache
//   DSA     index heads [r Hi/n, (r+1) Hi/n) (uneven when n does not divide Hi; a rank may hold none):
//           wq_b and weights_proj rows; wk / k_norm replicated (the index key is per token, so every rank
//           keeps the whole index-key cache); the partial scores are summed over ranks (reduce_index_scores)
//           before the top-k, which then runs identically on every rank. cfg.dsa.n_head is not divided.
//   GLU     dense MLP and shared experts: gate/up rows, down columns (partial sum, reduced)
//   routed experts: untouched here (replicated, or expert parallel: ep.h)
// Embedding, norms, AttnRes, router and lm_head stay replicated; activations [n_tok, D] are replicated
// after every reduce. The per-rank config has n_head / n heads, so SeqState holds the rank's share of the
// KDA state. Row slices are views into the checkpoint; column slices are copies (shard_storage).
#pragma once

#include <string>

#include <memory>
#include "core/status.h"
#include "k3/config.h"

#include "ops/linear.h"

namespace k3 {

struct ModelWeights;

// ok when `n` divides every head count and GLU width that tp_shard splits; else names the first that not.
Status tp_check(const ModelConfig& cfg, int n);
// Shards cfg and w (bound for the full model) for rank `rank` of `n` (n == 1: unchanged).
Status tp_shard(ModelConfig& cfg, ModelWeights& w, int rank, int n);

// Slicing helpers (ep.cpp and tests use them too).
LinearWeight linear_rows(const LinearWeight& W, int64_t row0, int64_t n_rows);  // a view
// Columns [col0, col0 + n_cols) of W: a copy appended to *store. MXFP4 needs multiples of 32.
Result<LinearWeight> linear_cols(const LinearWeight& W, int64_t col0, int64_t n_cols,
                                 std::shared_ptr<void>& store);

}  // namespace k3
