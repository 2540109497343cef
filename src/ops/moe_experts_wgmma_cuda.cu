// moe_experts_wgmma_cuda.cu: the routed experts' prefill GEMMs on Hopper warpgroup MMAs (moe_experts.h, the
// wgmma prefill path; index rules: moe_experts_layout.h "warpgroup-MMA prefill"; mirrored on the host by
// moe_experts_cpu.cpp).
//
// C^T = W X^T per expert, as in the other kernels: the weights are the MMA's A operand (M = 64 neurons a
// warpgroup), X^T its B operand (N = the tile's rows rounded up to 16, <= 128).
// Block = 2 warpgroups (256 threads) on one (neuron block, tile of <= 128 sorted rows of one expert):
//   DUAL (gate/up): warpgroup w owns neurons n0 + 64 w .. + 63 of w1 (accA) and of w3 (accB): 128 a block;
//   down:           warpgroup w owns rows n0 + 128 w .. + 63 (accA) and + 64 .. + 127 (accB): 256 a block.
// Weights: a lane loads the 16 bytes of its 32-column group for rows g and g + 8 of each operand straight
// into registers, one chunk (128 columns) ahead, and decodes them into the A registers by the decode
// kernel's nibble-pair rules (moe::e2m1_pair times 2^(e - 1)); no weight byte goes through shared memory.
// Activations: the tile's rows, stored in the wg order (moe::wg_pos), are copied per chunk into two
// 128-byte-swizzled blocks of N rows x 64 (the k order the MMA reads) by a 4-slot cp.async ring, 2 chunks
// ahead (a slot is rewritten only after every warpgroup retired the chunk that read it, 2 chunks back).
// Per chunk, 8 k16 steps in 4 pairs: decode a pair into one of two register sets, fence, 4 wgmma (2 steps x
// 2 operands), commit, then wait until the previous pair's group is done, which frees the other set.
// Grid: x = neuron blocks (fastest, so the blocks of one tile run together and share its X from L2), y =
// tiles (an upper bound; blocks past the last tile return).
// Probe builds (bench only, wrong results): -DMOE_WG_PROBE=1 no decode (raw words as A), 2 no wgmma, 3 no
// weight loads (constant words).
#include <cuda_bf16.h>

#include <atomic>
#include <type_traits>

#include "core/cuda_check.h"
#include "ops/cuda_mma.cuh"
#include "ops/mla_wgmma.cuh"
#include "ops/moe_experts_cuda.cuh"
#include "ops/wgmma_rs.cuh"

namespace k3::moe_cuda {

namespace {

using cuda_ops::round_bf16_dev;
using mla_detail::fence_proxy_async;
using mla_detail::fence_regs;
using mla_detail::sw128;
using mla_detail::wgmma_commit;
using mla_detail::wgmma_desc;
using mla_detail::wgmma_fence;

constexpr int kThreads = 256, kSlots = 4, kMaxN = moe::kWgTile;
constexpr size_t kSmem = 1024 + size_t(kSlots) * kMaxN * 256;  // + 1024: base alignment of the swizzle

struct WgRaw {        // one lane's weights of one chunk
  uint4 a0, a1, b0, b1;  // rows g, g + 8 of operand A, then of B: the 16 bytes of the lane's group
  uint32_t ex[4];        // their E8M0 exponents
};

struct WgRows {  // one lane's rows g (A: w[0], B: w[1]) and g + 8 (+ 8 rows): its group's bytes, scales
  const uint8_t *w[2], *s[2];
  uint32_t w8, s8;  // bytes of 8 rows of weights / scales
  uint32_t ok;      // bit i: row i of (A g, A g + 8, B g, B g + 8) is below n_out (else zeros, exponent 127)
};

#ifndef MOE_WG_PROBE
#define MOE_WG_PROBE 0
#endif

__device__ __forceinline__ void load_raw(WgRaw& r, const WgRows& rows, int c) {
  const uint4 z = make_uint4(0, 0, 0, 0);
  if (MOE_WG_PROBE == 3) {
    r.a0 = r.a1 = r.b0 = r.b1 = make_uint4(0x11111111u * uint32_t(c & 7), 0x22222222u, 0x33333333u, 0x44444444u);
    r.ex[0] = r.ex[1] = r.ex[2] = r.ex[3] = 120u;
    return;
  }
  uint4* dst[4] = {&r.a0, &r.a1, &r.b0, &r.b1};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const bool ok = rows.ok >> i & 1;
    const uint8_t* w = rows.w[i / 2] + (i & 1) * rows.w8 + c * (moe::kChunk / 2);
    const uint8_t* sc = rows.s[i / 2] + (i & 1) * rows.s8 + c * (moe::kChunk / 32);
    *dst[i] = ok ? __ldg(reinterpret_cast<const uint4*>(w)) : z;
    r.ex[i] = ok ? __ldg(sc) : 127u;
  }
}

// A registers of steps 2 wi, 2 wi + 1 for both operands: f[0] = A's, f[1] = B's, each [step][4]
template <bool BIG>
__device__ __forceinline__ void decode_pair(const WgRaw& r, const uint32_t (&s)[4], const uint32_t (&t)[4],
                                            int wi, uint32_t (&fa)[2][4], uint32_t (&fb)[2][4]) {
  dec_frags<BIG>((&r.a0.x)[wi], (&r.a1.x)[wi], s[0], s[1], t[0], t[1], fa);
  dec_frags<BIG>((&r.b0.x)[wi], (&r.b1.x)[wi], s[2], s[3], t[2], t[3], fb);
}

template <bool DUAL, int N>
__device__ __forceinline__ void wg_tile(const GemmArgs& a, const MoeExpertPtrs& ep, int r0, int n_r,
                                        const int64_t* row_off, uint32_t smem) {
  constexpr int NA = N / 2;             // accumulator registers per operand
  constexpr uint32_t kBlock = N * 128;  // one swizzled block: N rows x 64 bf16
  constexpr int kCopies = (N * 16 + kThreads - 1) / kThreads;  // 16-byte copies a thread per chunk
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, wg = warp >> 2, w4 = warp & 3;
  const int g = lane >> 2, q = lane & 3;
  const int n0 = blockIdx.x * (DUAL ? 128 : 256);
  const int rowA = n0 + (DUAL ? 64 : 128) * wg + 16 * w4 + g, rowB = DUAL ? rowA : rowA + 64;
  WgRows rows;
  rows.w[0] = (DUAL ? ep.w1 : ep.w2) + size_t(rowA) * (a.K / 2) + q * 16;
  rows.w[1] = (DUAL ? ep.w3 : ep.w2) + size_t(rowB) * (a.K / 2) + q * 16;
  rows.s[0] = (DUAL ? ep.s1 : ep.s2) + size_t(rowA) * (a.K / 32) + q;
  rows.s[1] = (DUAL ? ep.s3 : ep.s2) + size_t(rowB) * (a.K / 32) + q;
  rows.w8 = uint32_t(8 * (a.K / 2)), rows.s8 = uint32_t(8 * (a.K / 32));
  rows.ok = uint32_t(rowA < a.n_out) | uint32_t(rowA + 8 < a.n_out) << 1 | uint32_t(rowB < a.n_out) << 2 |
            uint32_t(rowB + 8 < a.n_out) << 3;
  const int n_chunk = a.K / moe::kChunk;
  // the tile's X rows: thread copies 16-byte unit u = tid % 16 of rows tid / 16 + 16 i (the swizzle's row
  // phase r % 8 is the same for all of them)
  const int u = tid & 15, rq = tid >> 4;
  const uint32_t dst0 = uint32_t(u >> 3) * kBlock + sw128(rq, u & 7);
  const char* x = reinterpret_cast<const char*>(a.x) + u * 16;
  // chunk c of the tile's X rows into slot c % kSlots; rows past n_r repeat row 0: an MMA's output column
  // depends on its own B column only, and those token columns are never stored
  auto stage = [&](int c) {
    const uint32_t slot = smem + uint32_t(c % kSlots) * 2 * kBlock + dst0;
#pragma unroll
    for (int i = 0; i < kCopies; ++i)
      if (rq + 16 * i < N)
        k3::cp_async16(slot + uint32_t(i) * 16 * 128, x + row_off[rq + 16 * i] + c * moe::kChunk * 2);
    cp_async_commit();
  };

  float accA[NA], accB[NA];
#pragma unroll
  for (int i = 0; i < NA; ++i) accA[i] = accB[i] = 0.f;
  stage(0);
  if (n_chunk > 1) stage(1);
  else cp_async_commit();
  WgRaw cur;
  load_raw(cur, rows, 0);
  uint32_t f[2][2][2][4] = {};  // [register set][operand][step][4]: set wi % 2 feeds steps 2 wi, 2 wi + 1

  // one chunk's 8 k16 steps; BIG: some exponent exceeds kPairScaleMax (CTA-uniform, so every warp of a
  // warpgroup issues the same wgmma instructions)
  auto steps = [&](auto big, uint32_t slot, const uint32_t(&s)[4], const uint32_t(&t)[4]) {
#pragma unroll
    for (int wi = 0; wi < 4; ++wi) {
      uint32_t(&fa)[2][4] = f[wi & 1][0];
      uint32_t(&fb)[2][4] = f[wi & 1][1];
      if (MOE_WG_PROBE == 1) {
#pragma unroll
        for (int h = 0; h < 2; ++h)
#pragma unroll
          for (int i = 0; i < 4; ++i) fa[h][i] = (&cur.a0.x)[wi] ^ (&cur.a1.x)[i], fb[h][i] = (&cur.b0.x)[wi] ^ s[i];
      } else {
        decode_pair<decltype(big)::value>(cur, s, t, wi, fa, fb);
      }
      wgmma_fence();
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int st = 2 * wi + h;  // k16 step: block st / 4, 32 bytes per step inside it
        const uint64_t desc = wgmma_desc(slot + uint32_t(st >> 2) * kBlock + uint32_t(st & 3) * 32, 16, 1024);
        if (MOE_WG_PROBE != 2) {
          wgmma::RS<N>::mma(accA, fa[h], desc, 1);
          wgmma::RS<N>::mma(accB, fb[h], desc, 1);
        }
      }
      wgmma_commit();
      mla_detail::wgmma_wait<1>();  // the previous pair is done: its register set may be rewritten
#pragma unroll
      for (int o = 0; o < 2; ++o)
#pragma unroll
        for (int h = 0; h < 2; ++h) fence_regs(f[(wi + 1) & 1][o][h]);
    }
  };

  for (int c = 0; c < n_chunk; ++c) {
    k3::cp_async_wait<1>();  // this thread's copies of chunk c are done (chunk c + 1's may still fly)
    fence_proxy_async();
    const bool big_here = max(max(cur.ex[0], cur.ex[1]), max(cur.ex[2], cur.ex[3])) > moe::kPairScaleMax;
    // everyone's copies of chunk c landed; chunk c - 2's wgmmas retired everywhere
    const bool big = __syncthreads_or(big_here);
    if (c + 2 < n_chunk) stage(c + 2);
    else cp_async_commit();  // an empty group keeps the count of pending groups uniform
    WgRaw nxt;
    if (c + 1 < n_chunk) load_raw(nxt, rows, c + 1);
    uint32_t s[4], t[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) pair_scales(cur.ex[i], s[i], t[i]);
    const uint32_t slot = smem + uint32_t(c % kSlots) * 2 * kBlock;
    if (big)
      steps(std::true_type{}, slot, s, t);
    else
      steps(std::false_type{}, slot, s, t);
    if (c + 1 < n_chunk) cur = nxt;
  }
  mla_detail::wgmma_wait0();
  fence_regs(accA);
  fence_regs(accB);
  // accumulator d[4 j + e]: neuron row 16 w4 + g + 8 (e / 2) of the warpgroup's 64, token 8 j + 2 q + e % 2
#pragma unroll
  for (int j = 0; j < N / 8; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int tok = 8 * j + 2 * q + (e & 1), nr = 16 * w4 + g + 8 * (e >> 1);
      if (tok >= n_r) continue;
      const int i = 4 * j + e;
      if constexpr (DUAL) {
        const int neuron = n0 + 64 * wg + nr;
        if (neuron >= a.n_out) continue;
        const float gv = round_bf16_dev(accA[i]), uv = round_bf16_dev(accB[i]);
        const int pos = (neuron & ~127) | moe::wg_pos(neuron & 127);  // h in wg order: the down GEMM's X
        a.out[size_t(r0 + tok) * a.n_out + pos] = __float2bfloat16_rn(act_dev(a.act, gv, uv, a.beta1, a.beta2));
      } else {
        const size_t orow = size_t(a.order[r0 + tok]) * a.n_out;
        const int nA = n0 + 128 * wg + nr;
        if (nA < a.n_out) a.out[orow + nA] = __float2bfloat16_rn(accA[i]);
        if (nA + 64 < a.n_out) a.out[orow + nA + 64] = __float2bfloat16_rn(accB[i]);
      }
    }
}

template <bool DUAL>
__global__ void __launch_bounds__(kThreads, 1) experts_wgmma_kernel(GemmArgs a) {
  extern __shared__ unsigned char smem_raw[];
  __shared__ int64_t row_off[kMaxN];  // byte offset of each tile row's X row (row 0's past n_r)
  const int tile = blockIdx.y;
  if (tile >= a.tile_start[a.E]) return;
  const int e = moe::tile_expert(a.tile_start, a.E, tile);
  int r0, n_r;
  moe::wg_tile_rows(a.offsets, a.tile_start, e, tile, r0, n_r);
  const int tid = threadIdx.x;
  if (tid < kMaxN) {
    const int r = r0 + (tid < n_r ? tid : 0);
    row_off[tid] = int64_t(DUAL ? a.order[r] / a.k : r) * a.K * 2;
  }
  __syncthreads();
  const MoeExpertPtrs ep = a.experts[e];
  const uint32_t raw = static_cast<uint32_t>(__cvta_generic_to_shared(smem_raw));
  const uint32_t smem = (raw + 1023) & ~1023u;
  switch ((n_r + 15) / 16) {  // block-uniform: N = rows rounded up to 16
    case 1: wg_tile<DUAL, 16>(a, ep, r0, n_r, row_off, smem); break;
    case 2: wg_tile<DUAL, 32>(a, ep, r0, n_r, row_off, smem); break;
    case 3: wg_tile<DUAL, 48>(a, ep, r0, n_r, row_off, smem); break;
    case 4: wg_tile<DUAL, 64>(a, ep, r0, n_r, row_off, smem); break;
    case 5: wg_tile<DUAL, 80>(a, ep, r0, n_r, row_off, smem); break;
    case 6: wg_tile<DUAL, 96>(a, ep, r0, n_r, row_off, smem); break;
    case 7: wg_tile<DUAL, 112>(a, ep, r0, n_r, row_off, smem); break;
    default: wg_tile<DUAL, 128>(a, ep, r0, n_r, row_off, smem); break;
  }
}

}  // namespace

void launch_wgmma(const GemmArgs& a, bool dual, int64_t n_rows, cudaStream_t stream) {
  K3_ASSERT(a.K % moe::kChunk == 0);
  const int64_t max_tiles = (n_rows + moe::kWgTile - 1) / moe::kWgTile + std::min<int64_t>(a.E, n_rows);
  K3_ASSERT(max_tiles < 65536);
  const int per_block = dual ? 128 : 256;
  const dim3 grid(unsigned((a.n_out + per_block - 1) / per_block), unsigned(max_tiles));
  static std::atomic<bool> sized[64] = {};
  smem_opt_in(sized, int(kSmem), experts_wgmma_kernel<true>, experts_wgmma_kernel<false>);
  (dual ? experts_wgmma_kernel<true> : experts_wgmma_kernel<false>)<<<grid, kThreads, kSmem, stream>>>(a);
  K3_CUDA_LAUNCH_CHECK();
}

}  // namespace k3::moe_cuda
