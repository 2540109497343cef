// mla_decode.h: absorbed MLA decode attention over the paged latent cache (MODEL.md §5, absorbed path).
//
// One new token per sequence b; the query is already absorbed into the latent space, so every head attends
// to the SAME cache rows (MQA over the latent cache):
//   q[b, h, :]     = [q_lat (512) | q_rope (64)]                                 bf16, 576 wide
//   row(b, t)      = cache[block_table[b, t / P], t % P, :] = [c_t (512) | k_rope_t (64)]   bf16, 576 wide
//   s_t            = scale * q[b, h, :] . row(b, t)           t = 0 .. ctx_len[b] - 1 (the token's own row
//                                                             is already written: causal = the whole prefix)
//   out[b, h, :]   = sum_t softmax(s)_t * c_t                                    fp32, 512 wide (the caller
//                                                             applies W_UV afterwards)
// fp32 accumulation; the CUDA tensor-core path also rounds the softmax weights to bf16 (NMSE ~1e-6) unless
// exact_p is set.
// Shapes: q [n_seq, n_head, 576], out [n_seq, n_head, 512], ctx_len [n_seq] (1 <= ctx_len[b] <= max_ctx
// <= max_pages * P), block_table [n_seq, max_pages] page indices into cache [n_pages, P, 576] (entries past
// a sequence's last page are never read).
//
// The CUDA backend is split-KV (flash-decoding): grid (head group, kv split, seq); each CTA streams a
// tile of cache rows once into shared memory and uses it for all the heads of its group (64 heads on the
// Hopper warpgroup-MMA kernel, 32 on the mma.sync one); every split keeps fp32 running max / sum /
// unnormalized output, and a combine kernel merges the splits. The byte floor per call is
// sum_b ctx_len[b] * 576 * 2 bytes; the FLOPs are sum_b ctx_len[b] * n_head * (576 + 512) * 2.
#pragma once

#include <cstddef>
#include <cstdint>

#include "core/gpu.h"
#include "core/status.h"

namespace k3 {

inline constexpr int kMlaLatent = 512;                 // kv_lora_rank: c_t and out width
inline constexpr int kMlaRope = 64;                    // qk_rope_head_dim
inline constexpr int kMlaRow = kMlaLatent + kMlaRope;  // 576 bf16 per token per layer

struct MlaDecodeParams {
  int n_seq = 0, n_head = 0;
  int page_size = 0;                     // P tokens per page
  int max_pages = 0;                     // block_table row length
  int64_t n_pages = 0;                   // pages in the pool
  int max_ctx = 0;                       // host-known bound on every ctx_len[b] (sizes the kv splits)
  const int32_t* ctx_len = nullptr;      // [n_seq]
  const int32_t* block_table = nullptr;  // [n_seq, max_pages]
  const uint16_t* cache = nullptr;       // bf16 [n_pages, page_size, 576]
  const uint16_t* q = nullptr;           // bf16 [n_seq, n_head, 576]
  float scale = 1.f;
  float* out = nullptr;  // [n_seq, n_head, 512]
  int n_split = 0;       // cuda: kv splits per sequence, 0 = chosen from the SM count and max_ctx
  // cuda: keep the softmax weights to 16 significant bits (relative error <= 2^-17; fp32 in the reference
  // and model/mla.cpp's attention_cpu) in P V instead of rounding them to bf16: the mma.sync kernel splits P
  // into two bf16 pieces and runs two MMAs (K3_MLA_EXACT_PIECES=3, read per call: three pieces, exact);
  // mla_decode_cuda then always takes that kernel (the wgmma one has no shared memory left for the pieces;
  // the CUDA-core kernel keeps fp32 weights anyway).
  bool exact_p = false;
};

// Shape checks only (no pointer is dereferenced, so it serves device params too).
Status mla_decode_check(const MlaDecodeParams& p);
// Plain reference on host pointers: fp64 scores, softmax and sums, one (seq, head) at a time; also checks
// ctx_len and every page index it reads (K3_ASSERT).
void mla_decode_ref(const MlaDecodeParams& p);

// CUDA (device pointers, asynchronous on g.stream; graph-capture safe: no allocation, no sync). Needs
// mla_decode_workspace_bytes(p) bytes of g.workspace for the per-split partials (n_split is reduced until
// it fits). Picks the sm_90a heads-as-N warpgroup-MMA kernel when the step reads at least 16K cache rows
// (n_seq x max_ctx), else the mma.sync one (docs/perf.md, sessions 4 and 15);
// K3_MLA_KERNEL=mma|wgmma|wgmma_hn forces one.
void mla_decode_cuda(const MlaDecodeParams& p, GpuContext& g);
// The mma.sync kernel explicitly (32 heads a CTA; the only one with exact_p).
void mla_decode_cuda_mma(const MlaDecodeParams& p, GpuContext& g);
// The sm_90a warpgroup-MMA kernels explicitly (not with exact_p): heads as the MMA's M (64 heads a CTA, the
// last group padded) and heads as its N (48 heads a CTA, products transposed).
void mla_decode_cuda_wgmma(const MlaDecodeParams& p, GpuContext& g);
void mla_decode_cuda_wgmma_hn(const MlaDecodeParams& p, GpuContext& g);
// The same contract on plain CUDA cores (no tensor cores): the slower cross-check of mla_decode_cuda.
void mla_decode_cuda_simple(const MlaDecodeParams& p, GpuContext& g);
// Workspace for n_split splits (n_split <= 0: the split count mla_decode_cuda would choose).
size_t mla_decode_workspace_bytes(const MlaDecodeParams& p, int n_split);

}  // namespace k3
