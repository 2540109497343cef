// attention.h: causal (optionally sparse) softmax attention for MLA / DSA (MODEL.md §5, §6).
//
//   out[i, h, :] = sum_{s in S_i} softmax_s(scale * q[i, h, :] . k[s, h, :]) v[s, h, :]      fp32
//   S_i = { s : s <= q_pos0 + i }                   dense causal (kv row s is absolute position s)
//       = { sel[i, j] : sel[i, j] >= 0 }            sparse: an index set per query (DSA top-k)
//
// Layouts are given by element strides so one entry point covers both MLA paths:
//   unabsorbed prefill: k [n_kv, n_head, d_nope + d_rope], v [n_kv, n_head, d_v] (per-head K/V)
//   absorbed decode:    MQA over the latent cache [n_kv, 576]: k = the whole row (head stride 0),
//                       v = its first kv_lora_rank entries (head stride 0)
#pragma once

#include <cstdint>

#include "core/gpu.h"

namespace k3 {

class ThreadPool;

struct AttentionParams {
  int64_t n_q = 0, n_kv = 0;
  int n_head = 0, d_qk = 0, d_v = 0;
  const float* q = nullptr;
  int64_t q_tok_stride = 0, q_head_stride = 0;  // [n_q, n_head, d_qk]
  const float* k = nullptr;
  int64_t k_tok_stride = 0, k_head_stride = 0;  // [n_kv, (n_head), d_qk]
  const float* v = nullptr;
  int64_t v_tok_stride = 0, v_head_stride = 0;  // [n_kv, (n_head), d_v]
  int64_t q_pos0 = 0;                           // absolute position of query row 0 (dense causal mask)
  const int32_t* sel = nullptr;  // [n_q, n_sel] kv positions, -1 = unused slot; null = dense causal
  int64_t n_sel = 0;
  float scale = 1.f;
  float* out = nullptr;  // [n_q, n_head, d_v]
};

// Plain reference: fp64 scores and sums, one (query, head) at a time.
void attention_ref(const AttentionParams& p);
// Fast CPU: fp32, threads over (query, head) pairs.
void attention_cpu(const AttentionParams& p, ThreadPool* pool);
// CUDA (core/gpu.h): device pointers, same contract.
void attention_cuda(const AttentionParams& p, GpuContext& g);

}  // namespace k3
