// mla_decode_wgmma_cuda.cu: absorbed MLA decode, the Hopper warpgroup-MMA split kernel (contract:
// mla_decode.h; split plan and partials: mla_decode_cuda.cuh; wgmma operand layout: mla_wgmma.cuh).
//
// CTA = 64 heads (the M of every wgmma; zero rows past n_head) x one kv split of one sequence, 256 threads
// = 2 warpgroups. Q (64 x 576) and 64-token tiles of cache rows sit in shared memory as 9 swizzled blocks
// of 64 rows x 64 columns; tiles are double-buffered by cp.async (paged: one block-table read a row).
// Per tile:
//   WG0:  S = Q K^T (64 heads x 64 tokens: 36 x m64n64k16, both operands K-major in smem);
//         online softmax on S's fragment (a quad of lanes owns 2 head rows: no shared memory needed);
//         P (bf16, one 64 x 64 block) and the rescale alpha to shared memory.
//   both: O_w = alpha O_w + P V_w (4 x m64n256k16; V = the tile's first 8 blocks read MN-major):
//         WG0 dims 0..255, WG1 dims 256..511, 128 fp32 accumulators a thread.
// smem: Q 72 KiB + 2 tiles x 72 KiB + P 8 KiB + alpha = 225 KiB (one CTA per SM).
#include <cuda_bf16.h>

#include <cmath>
#include <cstdlib>

#include "core/env.h"
#include "ops/cuda_util.cuh"
#include "ops/mla_decode_cuda.cuh"
#include "ops/mla_wgmma.cuh"

namespace k3::mla_detail {
namespace {

constexpr int kBlk = 64 * 128;                     // bytes of one 64-row x 64-column swizzled block
constexpr int kTileBytes = (kMlaRow / 64) * kBlk;  // 9 blocks: 64 rows x 576
constexpr int kThreads = 256;
constexpr size_t kSmem = 1024 + 3 * size_t(kTileBytes) + kBlk + kWgHeads * 4;  // + 1024: base alignment
static_assert(kSmem <= 227 * 1024, "one CTA per SM");

// 64 rows of 576 bf16 into a 9-block tile: thread -> row tid / 4, chunks tid % 4 + 4 i (four threads
// cover 64 contiguous bytes). src(r) = the row's global address, nullptr = zero row.
template <class RowSrc>
__device__ __forceinline__ void load_tile(uint32_t tile, RowSrc src) {
  static_assert(kThreads == 4 * 64 && kChunks % 4 == 0, "4 threads per row");
  const int r = threadIdx.x / 4;
  const uint16_t* g = src(r);
#pragma unroll
  for (int i = 0; i < kChunks / 4; ++i) {
    const int c = threadIdx.x % 4 + 4 * i;
    const uint32_t dst = tile + (c / 8) * kBlk + sw128(r, c % 8);
    if (g)
      cp_async16(dst, g + c * 8);
    else
      asm volatile("st.shared.v4.u32 [%0], {%1, %1, %1, %1};\n" ::"r"(dst), "r"(0));
  }
}

__global__ void __launch_bounds__(kThreads, 1)
    mla_split_wgmma(MlaDecodeParams p, int n_split, int split_len, float* part_o, float* part_ml,
                    uint32_t v_lbo, uint32_t v_sbo) {
  extern __shared__ unsigned char smem_raw[];
  const uint32_t raw = smem_addr(smem_raw), base = (raw + 1023) & ~1023u;
  const uint32_t q_s = base, k_s = base + kTileBytes, p_s = base + 3 * kTileBytes;  // k_s: 2 tiles
  float* alpha_s = reinterpret_cast<float*>(smem_raw + (p_s + kBlk - raw));         // [64]

  const int b = blockIdx.z, split = blockIdx.y, h0 = blockIdx.x * kWgHeads;
  const int tid = threadIdx.x, wg = tid / 128, lane = tid % 32, r0 = (tid % 128) / 32 * 16 + lane / 4;
  const int n = p.ctx_len[b], t_begin = split * split_len, t_end = min(n, t_begin + split_len);
  const int n_tiles = t_end > t_begin ? (t_end - t_begin + kTile - 1) / kTile : 0;
  auto rows_from = [&](int t0) {
    return [&p, b, t0, t_end](int r) { return t0 + r < t_end ? row_ptr(p, b, t0 + r) : nullptr; };
  };

  load_tile(q_s, [&](int r) {
    return h0 + r < p.n_head ? p.q + (size_t(b) * p.n_head + h0 + r) * kMlaRow : nullptr;
  });
  if (n_tiles > 0) load_tile(k_s, rows_from(t_begin));
  cp_async_commit();

  float o[128];  // O_w fragment: rows r0, r0 + 8; dims 256 wg + 8 j + 2 (lane % 4) + {0, 1}
#pragma unroll
  for (int i = 0; i < 128; ++i) o[i] = 0.f;
  float m0 = -INFINITY, m1 = -INFINITY, l0 = 0.f, l1 = 0.f;  // WG0: running max (log2 units), partial sums
  const float scale_log2 = p.scale * 1.4426950408889634f;

  for (int it = 0; it < n_tiles; ++it) {
    const int t0 = t_begin + it * kTile;
    const uint32_t tile = k_s + (it & 1) * kTileBytes;
    if (it + 1 < n_tiles) load_tile(k_s + ((it + 1) & 1) * kTileBytes, rows_from(t0 + kTile));
    cp_async_commit();  // possibly empty: keeps "all but the newest group" = tile it
    cp_async_wait<1>();
    fence_proxy_async();
    __syncthreads();  // tile it (and Q) landed for every thread
    if (wg == 0) {
      float s[32];
#pragma unroll
      for (int i = 0; i < 32; ++i) s[i] = 0.f;
      wgmma_fence();
#pragma unroll
      for (int kk = 0; kk < kMlaRow / 16; ++kk) {
        const uint32_t off = (kk / 4) * kBlk + (kk % 4) * 32;
        wgmma_m64n64k16_ss(s, wgmma_desc(q_s + off, 16, 1024), wgmma_desc(tile + off, 16, 1024), 1);
      }
      wgmma_commit();
      wgmma_wait0();
      fence_regs(s);
      // online softmax over the tile: row r0 holds s[4 j + {0, 1}], row r0 + 8 s[4 j + {2, 3}]
      const int lim = t_end - t0;  // valid columns < lim (>= 1)
      float mx0 = -INFINITY, mx1 = -INFINITY;
#pragma unroll
      for (int j = 0; j < 8; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int col = 8 * j + 2 * (lane % 4) + (e & 1);
          const float v = col < lim ? s[4 * j + e] * scale_log2 : -INFINITY;
          s[4 * j + e] = v;
          if (e < 2)
            mx0 = fmaxf(mx0, v);
          else
            mx1 = fmaxf(mx1, v);
        }
#pragma unroll
      for (int o2 = 1; o2 < 4; o2 <<= 1) {
        mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, o2));
        mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, o2));
      }
      const float mn0 = fmaxf(m0, mx0), mn1 = fmaxf(m1, mx1);  // finite: column 0 is valid
      const float a0 = exp2f(m0 - mn0), a1 = exp2f(m1 - mn1);  // m = -inf -> 0
      m0 = mn0, m1 = mn1;
      float sum0 = 0.f, sum1 = 0.f;
      unsigned char* pb = smem_raw + (p_s - raw);
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        const __nv_bfloat162 x0 = __floats2bfloat162_rn(exp2f(s[4 * j] - mn0), exp2f(s[4 * j + 1] - mn0));
        const __nv_bfloat162 x1 = __floats2bfloat162_rn(exp2f(s[4 * j + 2] - mn1), exp2f(s[4 * j + 3] - mn1));
        const float2 f0 = __bfloat1622float2(x0), f1 = __bfloat1622float2(x1);
        sum0 += f0.x + f0.y, sum1 += f1.x + f1.y;
        *reinterpret_cast<__nv_bfloat162*>(pb + sw128(r0, j) + (lane % 4) * 4) = x0;
        *reinterpret_cast<__nv_bfloat162*>(pb + sw128(r0 + 8, j) + (lane % 4) * 4) = x1;
      }
      l0 = l0 * a0 + sum0, l1 = l1 * a1 + sum1;
      if (lane % 4 == 0) alpha_s[r0] = a0, alpha_s[r0 + 8] = a1;
      fence_proxy_async();
    }
    __syncthreads();  // P and alpha ready
    const float a0 = alpha_s[r0], a1 = alpha_s[r0 + 8];
#pragma unroll
    for (int j = 0; j < 32; ++j) o[4 * j] *= a0, o[4 * j + 1] *= a0, o[4 * j + 2] *= a1, o[4 * j + 3] *= a1;
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < kTile / 16; ++kk)
      wgmma_m64n256k16_ss_tb(o, wgmma_desc(p_s + kk * 32, 16, 1024),
                             wgmma_desc(tile + 4 * wg * kBlk + kk * 16 * 128, v_lbo, v_sbo), 1);
    wgmma_commit();
    wgmma_wait0();
    fence_regs(o);
    __syncthreads();  // the tile and P are rewritten next iteration
  }

  const size_t base_row = (size_t(b) * n_split + split) * p.n_head;
#pragma unroll
  for (int e2 = 0; e2 < 2; ++e2) {
    const int h = h0 + r0 + 8 * e2;
    if (h >= p.n_head) continue;
    float* dst = part_o + (base_row + h) * kMlaLatent + 256 * wg + 2 * (lane % 4);
#pragma unroll
    for (int j = 0; j < 32; ++j)
      *reinterpret_cast<float2*>(dst + 8 * j) = make_float2(o[4 * j + 2 * e2], o[4 * j + 2 * e2 + 1]);
  }
  if (wg == 0) {
#pragma unroll
    for (int o2 = 1; o2 < 4; o2 <<= 1) {
      l0 += __shfl_xor_sync(0xffffffffu, l0, o2);
      l1 += __shfl_xor_sync(0xffffffffu, l1, o2);
    }
    const float ln2 = 0.6931471805599453f;
    if (lane % 4 == 0) {
      if (h0 + r0 < p.n_head)
        part_ml[(base_row + h0 + r0) * 2] = m0 * ln2, part_ml[(base_row + h0 + r0) * 2 + 1] = l0;
      if (h0 + r0 + 8 < p.n_head)
        part_ml[(base_row + h0 + r0 + 8) * 2] = m1 * ln2, part_ml[(base_row + h0 + r0 + 8) * 2 + 1] = l1;
    }
  }
}

}  // namespace

void launch_split_wgmma(const MlaDecodeParams& p, const Split& s, float* part_o, float* part_ml,
                        cudaStream_t st) {
  // V descriptor: LBO = next 64 dims (one block), SBO = next 8 tokens. K3_MLA_WG_VDESC=1 swaps the two
  // (a probe of the MN-major descriptor convention on a new toolchain; the op tests say which is right).
  static const bool swap = [] {
    K3_CUDA_ASSERT(
        cudaFuncSetAttribute(mla_split_wgmma, cudaFuncAttributeMaxDynamicSharedMemorySize, int(kSmem)));
    return env_switch("K3_MLA_WG_VDESC", false);
  }();
  const dim3 grid((p.n_head + kWgHeads - 1) / kWgHeads, s.n_split, p.n_seq);
  mla_split_wgmma<<<grid, kThreads, kSmem, st>>>(p, s.n_split, s.split_len, part_o, part_ml,
                                                 swap ? 1024 : kBlk, swap ? kBlk : 1024);
  K3_CUDA_LAUNCH_CHECK();
}

}  // namespace k3::mla_detail
