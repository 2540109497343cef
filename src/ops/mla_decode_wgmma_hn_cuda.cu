// mla_decode_wgmma_hn_cuda.cu: absorbed MLA decode, the Hopper warpgroup-MMA split kernel with the heads as
// the N of every MMA (contract: mla_decode.h; split plan and partials: mla_decode_cuda.cuh; wgmma operand
// layout: mla_wgmma.cuh).
//
// wgmma's M is 64 and its N any multiple of 8, so the products run transposed: K3's 96 heads are two CTAs of
// 48 with no padded MMA rows (the heads-as-M kernel, mla_decode_wgmma_cuda.cu, runs 64 + 32 padded: 1.33x
// the FLOPs). CTA = 48 heads x one kv split of one sequence, 384 threads = 3 warpgroups:
//   WG0       S^T (64 tokens x 48 heads) = K (64 x 576) Q^T: 36 x m64n48k16, both operands K-major;
//             online softmax over the tokens = S^T's rows with a lazily moved reference max (kLazy: a
//             one-barrier vote; the column max crosses the 4 warps through shared memory only when a score
//             outgrows it; the column sums stay per thread until the end);
//             P^T (bf16, 48 heads x 64 tokens, K-major) and the rescale alpha to shared memory.
//   WG1, WG2  load the tiles (cp.async, two buffers) and Q;
//             O^T (512 dims x 48 heads) = alpha O^T + V^T (512 x 64) P^T (64 x 48): WG1 dims 0..255, WG2
//             256..511, 4 x 4 x m64n48k16 a tile (V^T = the tile's first 8 blocks read MN-major), 96 fp32
//             accumulators a thread.
// WG0's S of tile i + 1 overlaps WG1/WG2's P V of tile i: the loads do not wait for their copies; an
// mbarrier per tile buffer completes when they land, and WG0 waits on it. The rest is named barriers:
//   full[buf]      mbarrier: tile i (and Q) landed   WG1/WG2's copies arrive (cp.async), WG0 waits
//   kPReady + buf  P(i) and alpha(i) written         WG0 arrives, WG1/WG2 wait
//   kPFree + buf   P buffer buf read by P V          WG1/WG2 arrive, WG0 waits before writing it again
//   kRed           WG0's lazy-rescale vote and cross-warp column max
//   kVFree         WG1 and WG2 both done reading tile i's V (each loads blocks of the tile the other reads)
// Tile i + 2 is loaded into buffer buf once P V(i) is done (and so, through kPReady, S(i)). A role arrives on
// a barrier id again only after the other role has waited on its previous phase, which is what makes one id
// per buffer enough.
// -DMLA_HN_PROBE=1 / 2 / 3 (timing-probe builds; the results are wrong): 1 loads only tiles 0 and 1 (later
// tiles reuse them: the MMA, softmax and barrier chain alone), 2 skips the MMAs (loads, softmax and
// barriers), 3 skips the softmax (loads, MMAs and barriers).
// Rows past the split's end (and heads past n_head) load the last valid row again: their scores are masked
// to P = 0 and the copies stay all cp.async (no generic-proxy zero stores to order against wgmma).
// smem: Q 54 KiB + 2 tiles x 72 KiB + 2 P x 6 KiB + alpha, the max exchange, 2 mbarriers, 2 rescale flags =
// 211 KiB (one CTA per SM).
#include <cuda_bf16.h>

#include <cmath>
#include <string>

#include "core/env.h"
#include "ops/cuda_util.cuh"
#include "ops/mla_decode_cuda.cuh"
#include "ops/mla_wgmma.cuh"

namespace k3::mla_detail {
namespace {

constexpr int kHn = kWgHnHeads;                    // heads a CTA: the N of every MMA
constexpr int kBlk = 64 * 128;                     // one 64-token x 64-column swizzled block of a tile
constexpr int kTileBytes = (kMlaRow / 64) * kBlk;  // 9 blocks: 64 tokens x 576
constexpr int kQBlk = kHn * 128;                   // one 48-head x 64-column block of Q
constexpr int kQBytes = (kMlaRow / 64) * kQBlk;
constexpr int kPBytes = kHn * 128;  // P^T: 48 heads x 64 tokens (128 bytes a head)
constexpr int kThreads = 384;
constexpr size_t kSmem =
    1024 + kQBytes + 2 * size_t(kTileBytes) + 2 * kPBytes + (2 + 2 * 4) * kHn * 4 + 16 /* mbarriers */ + 8;
static_assert(kSmem <= 227 * 1024, "one CTA per SM");
static_assert(kQBlk % 1024 == 0 && kPBytes % 1024 == 0, "swizzled blocks are 1024-aligned");

// Lazy rescaling: a column's reference max m moves (and O and l are rescaled) only when a score exceeds it by
// more than kLazy (log2 units), so P = 2^(s - m) <= 2^kLazy; softmax is invariant to the choice of m, and
// bf16 P keeps its relative precision above 1. Most tiles then skip the cross-warp max and the O rescale.
constexpr float kLazy = 8.f;

#ifndef MLA_HN_PROBE
#define MLA_HN_PROBE 0
#endif
constexpr int kProbe = MLA_HN_PROBE;  // 0 in every build but bench/mla_cuda/build.sh's probe binaries

enum Barrier { kPReady = 1 /* + buffer */, kPFree = 3 /* + buffer */, kRed = 5, kVFree = 6 };

__device__ __forceinline__ void mbar_arrive(uint32_t bar) {  // MLA_HN_PROBE=1 only
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
}
// bar.red.or over n threads of barrier id: true on every thread when pred is true on any.
__device__ __forceinline__ bool bar_or(int id, int n, bool pred) {
  uint32_t r;
  asm volatile(
      "{\n\t.reg .pred p, q;\n\tsetp.ne.u32 p, %1, 0;\n\t"
      "bar.red.or.pred q, %2, %3, p;\n\tselp.u32 %0, 1, 0, q;\n\t}"
      : "=r"(r)
      : "r"(uint32_t(pred)), "r"(id), "r"(n)
      : "memory");
  return r != 0;
}
__device__ __forceinline__ void bar_sync(int id, int n) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(n) : "memory");
}
__device__ __forceinline__ void bar_arrive(int id, int n) {
  asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(n) : "memory");
}

// Rows [0, Rows) of 576 bf16 into 9 swizzled blocks of Blk bytes, by the 256 threads of WG1/WG2 (u =
// 0..255): thread -> row u / 4, chunks u % 4 + 4 i. src(r) = the row's global address.
template <int Rows, int Blk, class RowSrc>
__device__ __forceinline__ void load_rows(uint32_t dst0, int u, RowSrc src) {
  static_assert(Rows <= 64 && kChunks % 4 == 0, "4 threads per row");
  const int r = u / 4;
  if (r >= Rows) return;
  const uint16_t* g = src(r);
#pragma unroll
  for (int i = 0; i < kChunks / 4; ++i) {
    const int c = u % 4 + 4 * i;
    cp_async16(dst0 + (c / 8) * Blk + sw128(r, c % 8), g + c * 8);
  }
}

__global__ void __launch_bounds__(kThreads, 1)
    mla_split_wgmma_hn(MlaDecodeParams p, int n_split, int split_len, float* part_o, float* part_ml,
                       uint32_t v_lbo, uint32_t v_sbo, bool lazy) {
  extern __shared__ unsigned char smem_raw[];
  const uint32_t raw = smem_addr(smem_raw), base = (raw + 1023) & ~1023u;
  const uint32_t q_s = base, k_s = q_s + kQBytes, p_s = k_s + 2 * kTileBytes;  // k_s, p_s: 2 buffers each
  float* alpha_s = reinterpret_cast<float*>(smem_raw + (p_s + 2 * kPBytes - raw));  // [2][48]
  float* red_s = alpha_s + 2 * kHn;                                                 // [2][4 warps][48]
  const uint32_t full = smem_addr(red_s + 2 * 4 * kHn);                             // 2 mbarriers
  int* rescaled_s = reinterpret_cast<int*>(red_s + 2 * 4 * kHn + 4);                // [2]: alpha_s[buf] != 1

  const int b = blockIdx.z, split = blockIdx.y, h0 = blockIdx.x * kHn;
  const int tid = threadIdx.x, wg = tid / 128, warp = tid % 128 / 32, lane = tid % 32, q4 = lane % 4;
  const int r0 = warp * 16 + lane / 4;  // fragment rows r0, r0 + 8: tokens of S^T, dims of O^T
  const int n = p.ctx_len[b], t_begin = split * split_len, t_end = min(n, t_begin + split_len);
  const int n_tiles = t_end > t_begin ? (t_end - t_begin + kTile - 1) / kTile : 0;
  const size_t base_row = (size_t(b) * n_split + split) * p.n_head;
  if (tid == 0) mbar_init(full, 256), mbar_init(full + 8, 256);
  __syncthreads();

  if (wg == 0) {  // scores and softmax; column (head) c = 8 j + 2 q4 + e of fragment value 4 j + e (+ 2)
    float m[12], l[12];  // per column: running max (log2 units), this thread's rows' share of the sum
#pragma unroll
    for (int i = 0; i < 12; ++i) m[i] = -INFINITY, l[i] = 0.f;
    const float scale_log2 = p.scale * 1.4426950408889634f;
    for (int it = 0; it < n_tiles; ++it) {
      const int buf = it & 1, lim = t_end - (t_begin + it * kTile);  // valid tokens < lim (>= 1)
      const uint32_t tile = k_s + buf * kTileBytes;
      mbar_wait_parity(full + 8 * buf, (it >> 1) & 1);
      fence_proxy_async();
      float s[24];
#pragma unroll
      for (int i = 0; i < 24; ++i) s[i] = 0.f;
      if constexpr (kProbe != 2) {
        wgmma_fence();
#pragma unroll
        for (int kk = 0; kk < kMlaRow / 16; ++kk) {
          const uint32_t col = (kk % 4) * 32;
          wgmma_m64n48k16_ss<0>(s, wgmma_desc(tile + (kk / 4) * kBlk + col, 16, 1024),
                                wgmma_desc(q_s + (kk / 4) * kQBlk + col, 16, 1024), 1);
        }
        wgmma_commit();
        wgmma_wait0();
        fence_regs(s);
      }
      if constexpr (kProbe == 3) {  // no softmax: P and alpha stay as they are
        if (it >= 2) bar_sync(kPFree + buf, kThreads);
        bar_arrive(kPReady + buf, kThreads);
        continue;
      }
      bool grow = false;  // a score above its column's running max by more than kLazy
#pragma unroll
      for (int j = 0; j < 6; ++j)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const float v0 = r0 < lim ? s[4 * j + e] * scale_log2 : -INFINITY;
          const float v1 = r0 + 8 < lim ? s[4 * j + 2 + e] * scale_log2 : -INFINITY;
          s[4 * j + e] = v0, s[4 * j + 2 + e] = v1;
          grow |= fmaxf(v0, v1) > m[2 * j + e] + kLazy;  // m = -inf: any valid score
        }
      const bool rescale = !lazy || bar_or(kRed, 128, grow);
      float alpha[12];
      if (rescale) {  // the exact column max: the thread's two rows, the warp's 16, the 4 warps'
        float cm[12];
#pragma unroll
        for (int i = 0; i < 12; ++i) {
          cm[i] = fmaxf(s[4 * (i / 2) + i % 2], s[4 * (i / 2) + 2 + i % 2]);
#pragma unroll
          for (int x = 4; x < 32; x <<= 1) cm[i] = fmaxf(cm[i], __shfl_xor_sync(0xffffffffu, cm[i], x));
        }
        float* red = red_s + buf * 4 * kHn;
        if (lane < 4)
#pragma unroll
          for (int j = 0; j < 6; ++j)
            red[warp * kHn + 8 * j + 2 * q4] = cm[2 * j],
                                         red[warp * kHn + 8 * j + 2 * q4 + 1] = cm[2 * j + 1];
        bar_sync(kRed, 128);
#pragma unroll
        for (int j = 0; j < 6; ++j)
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            const int c = 8 * j + 2 * q4 + e, i = 2 * j + e;
            const float tmax = fmaxf(fmaxf(red[c], red[kHn + c]), fmaxf(red[2 * kHn + c], red[3 * kHn + c]));
            const float mn = fmaxf(m[i], tmax);  // finite: token 0 of the tile is valid
            alpha[i] = exp2f(m[i] - mn);         // m = -inf -> 0
            m[i] = mn;
          }
      } else {
#pragma unroll
        for (int i = 0; i < 12; ++i) alpha[i] = 1.f;
      }
      if (it >= 2) bar_sync(kPFree + buf, kThreads);  // P V of tile it - 2 is done with this buffer
      unsigned char* pb = smem_raw + (p_s + buf * kPBytes - raw);
#pragma unroll
      for (int j = 0; j < 6; ++j)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const int c = 8 * j + 2 * q4 + e, i = 2 * j + e;
          const __nv_bfloat16 x0 = __float2bfloat16_rn(exp2f(s[4 * j + e] - m[i]));
          const __nv_bfloat16 x1 = __float2bfloat16_rn(exp2f(s[4 * j + 2 + e] - m[i]));
          l[i] = l[i] * alpha[i] + __bfloat162float(x0) + __bfloat162float(x1);
          // P^T row c (head), tokens r0 and r0 + 8: chunks 2 warp and 2 warp + 1, byte 2 (lane / 4)
          *reinterpret_cast<__nv_bfloat16*>(pb + sw128(c, 2 * warp) + (lane / 4) * 2) = x0;
          *reinterpret_cast<__nv_bfloat16*>(pb + sw128(c, 2 * warp + 1) + (lane / 4) * 2) = x1;
        }
      if (warp == 0 && lane < 4 && rescale)
#pragma unroll
        for (int j = 0; j < 6; ++j)
          alpha_s[buf * kHn + 8 * j + 2 * q4] = alpha[2 * j],
                                          alpha_s[buf * kHn + 8 * j + 2 * q4 + 1] = alpha[2 * j + 1];
      if (tid == 0) rescaled_s[buf] = rescale;
      fence_proxy_async();
      bar_arrive(kPReady + buf, kThreads);
    }
    for (int it = n_tiles - 2; it < n_tiles; ++it)  // the last arrivals on the P buffers
      if (it >= 0) bar_sync(kPFree + (it & 1), kThreads);
    // column sums: the warp's 16 rows, then the 4 warps' (the max-exchange buffer tile n_tiles - 2 used)
    float* red = red_s + (n_tiles & 1) * 4 * kHn;
#pragma unroll
    for (int i = 0; i < 12; ++i)
#pragma unroll
      for (int x = 4; x < 32; x <<= 1) l[i] += __shfl_xor_sync(0xffffffffu, l[i], x);
    if (lane < 4)
#pragma unroll
      for (int j = 0; j < 6; ++j)
        red[warp * kHn + 8 * j + 2 * q4] = l[2 * j], red[warp * kHn + 8 * j + 2 * q4 + 1] = l[2 * j + 1];
    bar_sync(kRed, 128);
    if (warp == 0 && lane < 4)
#pragma unroll
      for (int j = 0; j < 6; ++j)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const int c = 8 * j + 2 * q4 + e;
          if (h0 + c >= p.n_head) continue;
          float* ml = part_ml + (base_row + h0 + c) * 2;
          ml[0] = m[2 * j + e] * 0.6931471805599453f;  // natural-log units for mla_combine
          ml[1] = red[c] + red[kHn + c] + red[2 * kHn + c] + red[3 * kHn + c];
        }
    return;
  }

  // WG1 / WG2: loads and the output; fragment value 4 j + e of block d: dim 256 dg + 64 d + r0 + 8 (e / 2),
  // head 8 j + 2 q4 + e % 2
  const int u = tid - 128, dg = wg - 1;
  auto load_tile = [&](int i) {  // tile i into buffer i & 1, then its mbarrier arrival (all 256 threads)
    const int t0 = t_begin + i * kTile;
    load_rows<kTile, kBlk>(k_s + (i & 1) * kTileBytes, u,
                           [&](int r) { return row_ptr(p, b, min(t0 + r, t_end - 1)); });
    cp_async_mbar_arrive(full + 8 * (i & 1));
  };
  if (n_tiles > 0) {  // Q rides on tile 0's arrival
    load_rows<kHn, kQBlk>(
        q_s, u, [&](int r) { return p.q + (size_t(b) * p.n_head + min(h0 + r, p.n_head - 1)) * kMlaRow; });
    load_tile(0);
  }
  if (n_tiles > 1) load_tile(1);
  float o[4][24];
#pragma unroll
  for (int d = 0; d < 4; ++d)
#pragma unroll
    for (int i = 0; i < 24; ++i) o[d][i] = 0.f;
  for (int it = 0; it < n_tiles; ++it) {
    const int buf = it & 1;
    const uint32_t tile = k_s + buf * kTileBytes, pt = p_s + buf * kPBytes;
    bar_sync(kPReady + buf, kThreads);  // P(it) written; WG0 saw tile it land and is done with its S
    fence_proxy_async();
    if (rescaled_s[buf])
#pragma unroll
      for (int j = 0; j < 6; ++j) {
        const float2 a = *reinterpret_cast<const float2*>(alpha_s + buf * kHn + 8 * j + 2 * q4);
#pragma unroll
        for (int d = 0; d < 4; ++d)
          o[d][4 * j] *= a.x, o[d][4 * j + 1] *= a.y, o[d][4 * j + 2] *= a.x, o[d][4 * j + 3] *= a.y;
      }
    if constexpr (kProbe != 2) {
      wgmma_fence();
#pragma unroll
      for (int d = 0; d < 4; ++d)
#pragma unroll
        for (int kk = 0; kk < kTile / 16; ++kk)
          wgmma_m64n48k16_ss<1>(o[d], wgmma_desc(tile + (4 * dg + d) * kBlk + kk * 16 * 128, v_lbo, v_sbo),
                                wgmma_desc(pt + kk * 32, 16, 1024), 1);
      wgmma_commit();
      wgmma_wait0();
#pragma unroll
      for (int d = 0; d < 4; ++d) fence_regs(o[d]);
    }
    bar_arrive(kPFree + buf, kThreads);
    if (it + 2 < n_tiles) {  // into the buffer S(it) and both halves of P V(it) are done with
      bar_sync(kVFree, 256);
      if constexpr (kProbe == 1)
        mbar_arrive(full + 8 * (it & 1));
      else
        load_tile(it + 2);
    }
  }
#pragma unroll
  for (int j = 0; j < 6; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int h = h0 + 8 * j + 2 * q4 + e % 2;
      if (h >= p.n_head) continue;
      float* dst = part_o + (base_row + h) * kMlaLatent + 256 * dg + r0 + 8 * (e / 2);
#pragma unroll
      for (int d = 0; d < 4; ++d) dst[64 * d] = o[d][4 * j + e];
    }
}

}  // namespace

void launch_split_wgmma_hn(const MlaDecodeParams& p, const Split& s, float* part_o, float* part_ml,
                           cudaStream_t st) {
  // V^T descriptor: LBO = next 64 dims (one block), SBO = next 8 tokens; K3_MLA_WG_VDESC=1 swaps them, as
  // for the heads-as-M kernel (mla_decode_wgmma_cuda.cu).
  static const bool swap = [] {
    K3_CUDA_ASSERT(
        cudaFuncSetAttribute(mla_split_wgmma_hn, cudaFuncAttributeMaxDynamicSharedMemorySize, int(kSmem)));
    return env_switch("K3_MLA_WG_VDESC", false);
  }();
  static const bool lazy = env_switch("K3_MLA_HN_LAZY", true);
  const dim3 grid((p.n_head + kHn - 1) / kHn, s.n_split, p.n_seq);
  mla_split_wgmma_hn<<<grid, kThreads, kSmem, st>>>(p, s.n_split, s.split_len, part_o, part_ml,
                                                    swap ? 1024 : kBlk, swap ? kBlk : 1024, lazy);
  K3_CUDA_LAUNCH_CHECK();
}

}  // namespace k3::mla_detail
