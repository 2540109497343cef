// mla.h: gated MLA without positions (MODEL.md §5), with the K3.1 DSA index set (§6), one layer.
//
//   q = q_b_proj RMSNorm(q_a_proj x; eps 1e-6)  (K3)  |  q_proj x  (KL)      q_h = [q_nope (d_nope) | q_r
//   (d_rope)] [c~ | r] = kv_a_proj_with_mqa x;  c = RMSNorm(c~; kv_a_layernorm, eps 1e-6)   cache row [c | r]
//   (d_latent) unabsorbed: [k_nope_h | v_h] = kv_b_proj c  per cached row;  k_h = [k_nope_h | r] (r shared,
//   not rotated)
//               z_h = softmax_{s in S_t}(q_h . k_h,s / sqrt(d_qk)) v_h
//   absorbed:   q^_h = [W_UK_h^T q_nope_h | q_r_h];  z^_h = softmax(q^_h . cache_s / sqrt(d_qk)) c_s;  z_h =
//   W_UV_h z^_h o = concat_h z_h;  o *= sigmoid(g_proj x) (K3 output gate, reads the layer input);  out =
//   o_proj o
// The two paths are equal in real arithmetic. S_t: causal, or the DSA selection (dsa.h).
#pragma once

#include <span>
#include <vector>

#include "k3/config.h"
#include "model/binder.h"
#include "model/common.h"
#include "model/dsa.h"

namespace k3 {

struct MlaWeights {
  LinearWeight q_proj;                // [n_head*d_qk, D] (KL)
  LinearWeight q_a_proj;              // [q_lora_rank, D] (K3)
  std::vector<float> q_a_layernorm;   // [q_lora_rank]
  LinearWeight q_b_proj;              // [n_head*d_qk, q_lora_rank]
  LinearWeight kv_a_proj_with_mqa;    // [kv_lora_rank + d_rope, D]
  std::vector<float> kv_a_layernorm;  // [kv_lora_rank]
  LinearWeight kv_b_proj;             // [n_head*(d_nope + d_v), kv_lora_rank]
  const TensorView* kv_b = nullptr;   // the same tensor, read row-wise for W_UK^T (absorbed path)
  LinearWeight o_proj;                // [D, n_head*d_v]
  LinearWeight g_proj;                // [n_head*d_v, D] (output gate)
  bool has_dsa = false;
  DsaWeights dsa;
};

struct MlaState {
  std::vector<float> latent;   // [n_past, d_latent]: [c (kv_lora_rank, post-norm) | r (d_rope)]
  std::vector<float> index_k;  // [n_past, dsa d_head] (DSA layers)
  // Unabsorbed-path cache, derived from `latent` (mla.cpp): kv_exp rows are [k_nope_h | r | v_h] per head
  // expanded from the latent rows copied in kv_src; a multi-token call expands only the rows past the
  // first one where kv_src and latent differ. Freed when the sequence takes the absorbed path (decode).
  std::vector<float> kv_exp;  // [n_exp, n_head, d_qk + d_v]
  std::vector<float> kv_src;  // [n_exp, d_latent]
};

// One sequence of a batch: rows [row0, row0 + n_tok) of x / out at positions n_past.., appended to *st.
struct MlaSeq {
  MlaState* st = nullptr;
  int64_t row0 = 0, n_tok = 0, n_past = 0;
  bool absorbed = false;  // attention path of this sequence
};

Status bind_mla(Binder& b, const ModelConfig& cfg, bool dsa, MlaWeights* w);
// x: [n_rows, D] attention input of every sequence in `seqs`; out: [n_rows, D]. Projections (and the
// absorbed path's W_UK / W_UV products) run once over all rows; attention runs per sequence.
void mla_forward(const Ctx& c, const ModelConfig& cfg, const MlaWeights& w, std::span<const MlaSeq> seqs,
                 const float* x, int64_t n_rows, float* out, int layer);

}  // namespace k3
