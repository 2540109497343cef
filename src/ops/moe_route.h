// moe_route.h: MoE router selection on the scores, MODEL.md §8.2 (K3 Stable LatentMoE) / §8.3 (KL).
//
//   s[t, e]  = sigmoid(logit[t, e])                       fp32, never rounded
//   c[t, e]  = s[t, e] + bias[e]                          the choice score (selection only)
//   sel[t,:] = top-k of c[t, :]      slot order: c descending, ties -> lower expert id; NaN c ranks as -inf
//   wt[t, j] = s[sel_j] / (sum_j s[sel_j] + 1e-20) * scaling     (no renormalize: s[sel_j] * scaling)
//
// The logits are the router GEMM output x W_gate^T (fp32 accumulation, unrounded); they may be the first
// n_expert columns of a wider row (the K3 fused router + latent down-projection output, row stride ld).
// The sum over the selected scores runs in slot order, as the CPU model does (model/moe.cpp moe_route).
// CUDA: one CTA per token (a bitonic top-k over 64-bit keys, moe_route_cuda.cu), everything on the device
// (graph-capture safe: no host reads, no allocation).
#pragma once

#include <cstdint>

#include "core/gpu.h"
#include "core/status.h"

namespace k3 {

struct MoeRouteParams {
  int64_t n_tok = 0;
  int n_expert = 0, k = 0;          // k = n_expert_used <= n_expert
  const float* logits = nullptr;    // [n_tok, n_expert], row stride ld (0: n_expert)
  int64_t ld = 0;
  const float* bias = nullptr;      // [n_expert] e_score_correction_bias (finite)
  bool renormalize = true;
  float scaling = 1.0f;             // routed_scaling_factor
  int32_t* sel = nullptr;           // [n_tok, k] expert ids, slot order
  float* wt = nullptr;              // [n_tok, k] mixture weights
};

// Shapes the kernels take: 1 <= k <= n_expert <= kMoeRouteMaxExpert.
constexpr int kMoeRouteMaxExpert = 4096;  // keys + scores + picks: 64 KB of shared memory at most
Status moe_route_check(const MoeRouteParams& p);

void moe_route_ref(const MoeRouteParams& p);
// CUDA (core/gpu.h): device pointers, same contract.
void moe_route_cuda(const MoeRouteParams& p, GpuContext& g);

}  // namespace k3
