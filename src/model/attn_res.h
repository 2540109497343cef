// attn_res.h: Block Attention Residuals (MODEL.md §7), the K3 / K3.1 replacement for residual adds.
//
//   AR(B[0..n-1], p, q):  V = [B_0, ..., B_{n-1}, p]                      fp32 values, no norm on V
//                         s_i = (q . V_i) rsqrt(mean_d(V_i^2) + eps)        RMSNorm on the keys only
//                         alpha = softmax_i(s);  return bf16(sum_i alpha_i V_i)   per token
//   q = fp32(norm.weight) * fp32(proj.weight), folded once at load time and never rounded.
//
// The layer loop (model.cpp) keeps B (finished block sums, bf16) and p (the running partial sum).
#pragma once

#include <vector>

#include "model/binder.h"
#include "model/common.h"

namespace k3 {

// q [D] = fp32(<base>_norm.weight) * fp32(<base>_proj.weight), base e.g. "self_attention_res".
std::vector<float> bind_attn_res_query(Binder& b, const std::string& base, int64_t d_model);

// sources: n arrays [n_tok, D] (the stored blocks, then the partial sum); out: [n_tok, D].
void attn_res_mix(const Ctx& c, const std::vector<const float*>& sources, const float* q, float eps,
                  int64_t n_tok, int64_t d_model, float* out);

}  // namespace k3
