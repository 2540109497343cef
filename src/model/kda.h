// kda.h: the Kimi Delta Attention token mixer (MODEL.md §4), one layer.
//
//   q~,k~,v~ = {q,k,v}_proj x                       [n_tok, H*K]   (bf16 rounding point)
//   q,k,v    = SiLU(causal depthwise conv_W(.))     W = 4 taps, window continued from the conv state
//   q^ = l2norm(q) K^-1/2, k^ = l2norm(k)           eps 1e-6, per head
//   beta = sigmoid(b_proj x)                        [n_tok, H], kept fp32
//   z = f_b_proj(f_a_proj x) + dt_bias              per (h, k)
//   g = -exp(A_log[h]) softplus(z)                  KL
//     = lb * sigmoid(exp(A_log[h]) z)               K3 / K3.1 (lb = gate_lower_bound = -5)
//   o = KDA(q^, k^, v, g, beta; S)                  ops/kda.h, S [H, K, V] fp32 carried across calls
//   y_h = o_h rsqrt(mean(o_h^2) + eps) w_onorm sigmoid(gate_h)   gate = g_proj x (K3) | g_b(g_a x) (KL)
//   out = o_proj concat_h y_h
#pragma once

#include <span>
#include <vector>

#include "k3/config.h"
#include "model/binder.h"
#include "model/common.h"

namespace k3 {

struct KdaWeights {
  LinearWeight q_proj, k_proj, v_proj;        // [H*K, D]
  std::vector<float> q_conv, k_conv, v_conv;  // [H*K, W] (checkpoint [H*K, 1, W]); tap W-1 = current token
  LinearWeight f_a_proj, f_b_proj;            // [r, D], [H*K, r]
  std::vector<float> dt_bias;                 // [H*K]
  std::vector<float> A_log;                   // [H] (K3 tail checked zero and dropped)
  LinearWeight b_proj;                        // [H, D]
  LinearWeight g_proj;                        // [H*K, D] (full-rank gate, K3)
  LinearWeight g_a_proj, g_b_proj;            // [r, D], [H*K, r] (KL)
  std::vector<float> o_norm;                  // [K]
  LinearWeight o_proj;                        // [D, H*K]
};

struct KdaState {
  std::vector<float> S;  // [H, K, V] fp32
  std::vector<float>
      conv;  // [3, W-1, H*K]: the last W-1 pre-conv q~, k~, v~ rows, oldest first (zeros at start)
};

struct KdaExec {
  bool recurrent = false;  // force token by token; otherwise chunkwise, recurrent for 1-token sequences
  int chunk = 64;
  bool reference = false;  // fp64 reference recurrence (tests)
};

// One sequence of a batch: rows [row0, row0 + n_tok) of x / out, continuing from *st.
struct KdaSeq {
  KdaState* st = nullptr;
  int64_t row0 = 0, n_tok = 0;
};

Status bind_kda(Binder& b, const ModelConfig& cfg, KdaWeights* w);
void init_kda_state(const ModelConfig& cfg, KdaState* s);
// x: [n_rows, D] attention input of every sequence in `seqs` (rows in order); out: [n_rows, D].
// Projections run once over all rows; the conv and the recurrence run per sequence on its own state.
void kda_forward(const Ctx& c, const ModelConfig& cfg, const KdaWeights& w, const KdaExec& ex,
                 std::span<const KdaSeq> seqs, const float* x, int64_t n_rows, float* out, int layer);

}  // namespace k3
