// mla_prefill.h: MLA prefill attention, dense causal, unabsorbed form (MODEL.md §5, unabsorbed path).
//
// Every head h has its own keys and values, expanded from the latent cache by kv_b_proj; the rope part of
// the key is the one shared row r_s of the latent cache:
//   q[t, h, :]    = [q_nope (128) | q_rope (64)]                    bf16, d_qk = 192
//   k[s, h, :]    = [k_nope[s, h, :] (128) | k_rope[s, (h), :] (64)]  bf16
//   v[s, h, :]    (128)                                              bf16
//   out[t, h, :]  = sum_{s <= q_pos0 + t} softmax_s(scale q[t, h] . k[s, h]) v[s, h]       fp32
// Query t sits at position q_pos0 + t (causal over the cache prefix); n_kv >= q_pos0 + n_q.
// fp32 accumulation; the CUDA kernel also rounds the softmax weights to bf16 (NMSE ~1e-6).
// Strides are in elements; every pointer and stride a multiple of 8 elements (16-byte rows for cp.async).
// A head stride of 0 on k_rope shares one rope row among all heads (the latent cache layout).
//
// The CUDA kernel is flash-attention style on mma.sync bf16 tensor cores: CTA = 128 queries of one head
// (8 warps x 16 rows, Q in registers), 64-key tiles of K and V double-buffered in shared memory by
// cp.async, online softmax in registers, P reused from the S accumulators as the A operand of P V.
// FLOPs (causal) ~ n_head * n_q * (q_pos0 + n_q / 2) * (192 + 128) * 2.
#pragma once

#include <cstdint>

#include "core/gpu.h"
#include "core/status.h"

namespace k3 {

inline constexpr int kMlaPrefillNope = 128;  // qk_nope_head_dim
inline constexpr int kMlaPrefillRope = 64;   // qk_rope_head_dim
inline constexpr int kMlaPrefillQk = kMlaPrefillNope + kMlaPrefillRope;
inline constexpr int kMlaPrefillV = 128;  // v_head_dim

struct MlaPrefillParams {
  int n_q = 0, n_kv = 0, n_head = 0;
  int q_pos0 = 0;               // position of query 0
  const uint16_t* q = nullptr;  // [n_q, n_head, 192]
  int64_t q_tok_stride = 0, q_head_stride = 0;
  const uint16_t* k_nope = nullptr;  // [n_kv, n_head, 128]
  int64_t k_tok_stride = 0, k_head_stride = 0;
  const uint16_t* k_rope = nullptr;  // [n_kv, n_head or shared, 64]
  int64_t r_tok_stride = 0, r_head_stride = 0;
  const uint16_t* v = nullptr;  // [n_kv, n_head, 128]
  int64_t v_tok_stride = 0, v_head_stride = 0;
  float scale = 1.f;
  float* out = nullptr;  // [n_q, n_head, 128], contiguous
};

// Shape and alignment checks (no pointer is dereferenced).
Status mla_prefill_check(const MlaPrefillParams& p);
// Plain reference on host pointers: fp64 scores, softmax and sums, one (query, head) at a time.
void mla_prefill_ref(const MlaPrefillParams& p);
// CUDA (device pointers, asynchronous on g.stream; no workspace).
void mla_prefill_cuda(const MlaPrefillParams& p, GpuContext& g);

}  // namespace k3
