// moe.h: the routed MoE layers (MODEL.md §8.2 Stable LatentMoE for K3/K3.1, §8.3 KL MoE), one layer.
//
//   s   = sigmoid(x W_gate^T)                     fp32, unrounded [n_expert]
//   sel = top-k of (s + e_score_correction_bias)  slot order: biased score desc, ties -> lower id
//   w_j = s[sel_j] / (sum_j s[sel_j] + 1e-20) * routed_scaling_factor       (unbiased weights)
//   KL:  y = bf16(sum_j w_j E_j(x))                                  E: GLU at full width
//   K3:  z = routed_expert_down_proj x;  y = bf16(sum_j w_j E_j(z));  y = RMSNorm(y; routed_expert_norm)
//        y = routed_expert_up_proj y
//   out = bf16(y + shared_experts(x))            the shared MLP always sees the full-width x
// The weighted sum runs in fp32 in slot order. Only num_expert_group = topk_group = 1 is supported.
#pragma once

#include <vector>

#include "k3/config.h"
#include "model/binder.h"
#include "model/common.h"
#include "model/ffn.h"

namespace k3 {

struct MoeWeights {
  LinearWeight gate;                // [n_expert, D]
  std::vector<float> bias;          // [n_expert] e_score_correction_bias (selection only)
  std::vector<FfnWeights> experts;  // w1/w3 [d_ff_expert, d_in], w2 [d_in, d_ff_expert]; d_in = d_latent or D
  FfnWeights shared;                // [n_shared * d_ff_expert, D] merged shared experts
  LinearWeight latent_down;         // [d_latent, D]  routed_expert_down_proj (K3)
  std::vector<float> latent_norm;   // [d_latent]     routed_expert_norm
  LinearWeight latent_up;           // [D, d_latent]  routed_expert_up_proj
};

Status bind_moe(Binder& b, const ModelConfig& cfg, MoeWeights* w);
// Top-k routing for one token: scores s [n_expert] (sigmoid output), bias [n_expert] -> sel, weights [k].
void moe_route(const ModelConfig& cfg, const float* s, const float* bias, int32_t* sel, float* weight);
// x: [n_tok, D] post_attention_layernorm output -> out: [n_tok, D].
void moe_forward(const Ctx& c, const ModelConfig& cfg, const MoeWeights& w, const float* x, int64_t n_tok,
                 float* out, int layer);

}  // namespace k3
