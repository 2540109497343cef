// dsa.h: the K3.1 DSA lightning indexer (MODEL.md §6): picks, per query, the cached positions the main MLA
// attention may read.
//
//   q^I_t = reshape_{Hi x Di}(wq_b c^Q_t)                       c^Q: the MLA q_a_layernorm output
//   k^I_s = bf16(LayerNorm(wk x_s; k_norm.weight, k_norm.bias, eps 1e-6))      [Di], cached per token
//   a_t   = weights_proj x_t                                    [Hi], no activation
//   I[t,s] = (Hi Di)^-1/2 sum_h a_{t,h} relu(q^I_{t,h} . k^I_s)            s <= t, fp32
//   S_t = all s <= t when t (1-based) <= topk; else the topk largest I[t,s], ties -> lower s
// No RoPE, no Hadamard. The selected set is returned sorted by position.
#pragma once

#include <vector>

#include "k3/config.h"
#include "model/binder.h"
#include "model/common.h"

namespace k3 {

struct DsaWeights {
  LinearWeight wq_b;                      // [Hi*Di, q_lora_rank]
  LinearWeight wk;                        // [Di, D]
  LinearWeight weights_proj;              // [Hi, D]
  std::vector<float> k_norm_w, k_norm_b;  // [Di]
};

Status bind_dsa(Binder& b, const ModelConfig& cfg, DsaWeights* w);

// Appends the new tokens' index keys to index_k ([n_past, Di] -> [n_past + n_tok, Di]) and fills sel
// [n_tok, topk] with selected positions (-1 padded). Returns false (sel untouched) when every query sees at
// most topk positions, i.e. the attention is dense.
bool dsa_select(const Ctx& c, const ModelConfig& cfg, const DsaWeights& w, const float* cq, const float* x,
                int64_t n_past, int64_t n_tok, std::vector<float>& index_k, std::vector<int32_t>* sel,
                int layer);

}  // namespace k3
