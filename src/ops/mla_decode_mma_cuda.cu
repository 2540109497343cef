// mla_decode_mma_cuda.cu: absorbed MLA decode, the mma.sync split kernel (contract: mla_decode.h; split plan
// and partials: mla_decode_cuda.cuh). The portable tensor-core path (any sm_80+), kept as the cross-check of
// the Hopper kernel (mla_decode_wgmma_cuda.cu); mla_decode_cuda runs it for steps under 16K cache rows.
//
// mla_split_mma: 32 heads (two m16 tiles) per CTA, 8 warps, 64-token tiles double-buffered by cp.async.
//   S = Q (32 x 576) K^T (576 x 64): warp w -> head tile w/4, tokens 16 (w%4) .. +16, mma m16n8k16 bf16.
//   softmax over the tile in shared memory (8 threads a row), P rounded to bf16.
//   O += P (32 x 64) V (64 x 512): warp w -> head tile w/4, dims 128 (w%4) .. +128 (64 fp32 accumulators).
// exact_p (mla_decode.h): P is kept to 16 significant bits instead, as two bf16 pieces P ~ P_hi + P_mid
// (P_mid = bf16(P - P_hi), the difference exact; relative error <= 2^-17), and O += P_hi V + P_mid V: 200
// MMAs a warp per tile instead of 136, 4.5 KiB more shared memory. K3_MLA_EXACT_PIECES=3 (read per call):
// exact, with P_lo = P - P_hi - P_mid as a third piece (3 x 8 significant bits hold fp32's 24), 264 MMAs.
// H100, session 19 (bench_dsa, sparse MLA over 2048 rows at b64): three pieces 289 us, two 258 us; NMSE
// against fp64 5.3e-13 / 1.2e-12; the GPU tests (K3.1's DSA layers against the CPU at 1e-4) pass with both.
#include <cuda_bf16.h>

#include <cmath>

#include "core/env.h"
#include "ops/cuda_util.cuh"
#include "ops/mla_decode_cuda.cuh"

namespace k3::mla_detail {
namespace {

constexpr int kStride = kMlaRow + 8;  // padded smem row (bf16): 1168 B, ldmatrix rows hit distinct banks
constexpr int kMmaThreads = 256;
constexpr int kPStride = kTile + 8;  // bf16 P row
constexpr int kSStride = kTile + 4;  // fp32 S row
// kPieces bf16 P blocks: 1 (P rounded to bf16), 2 (exact_p: hi, mid) or 3 (K3_MLA_EXACT_PIECES=3: hi, mid,
// lo)
constexpr size_t mma_smem(int pieces) {
  return size_t(kMmaHeads) * kStride * 2 + size_t(2) * kTile * kStride * 2 +
         size_t(kMmaHeads) * kSStride * 4 + size_t(pieces) * kMmaHeads * kPStride * 2 +
         size_t(3) * kMmaHeads * 4;
}
static_assert(mma_smem(3) <= 227 * 1024, "one CTA per SM");

// Issues cp.async for tile [t0, t0 + kTile) of sequence b into rows (zeros past t_end). Thread -> token
// tid / 4 (one block-table read), 16-byte chunks tid % 4 + 4 i: four threads cover 64 contiguous bytes.
__device__ __forceinline__ void load_tile(const MlaDecodeParams& p, int b, int t0, int t_end,
                                          uint16_t* rows) {
  static_assert(kMmaThreads == 4 * kTile && kChunks % 4 == 0, "4 threads per token row");
  const int tok = threadIdx.x / 4, t = t0 + tok;
  uint16_t* dst = rows + tok * kStride + (threadIdx.x % 4) * 8;
  if (t < t_end) {
    const uint16_t* src = row_ptr(p, b, t) + (threadIdx.x % 4) * 8;
#pragma unroll
    for (int i = 0; i < kChunks / 4; ++i)
      asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(smem_addr(dst + i * 32)),
                   "l"(src + i * 32));
  } else {
#pragma unroll
    for (int i = 0; i < kChunks / 4; ++i) *reinterpret_cast<uint4*>(dst + i * 32) = make_uint4(0, 0, 0, 0);
  }
  cp_async_commit();
}

template <int kPieces>
__global__ void __launch_bounds__(kMmaThreads, 1)
    mla_split_mma(MlaDecodeParams p, int n_split, int split_len, float* part_o, float* part_ml) {
  static_assert(kPieces >= 1 && kPieces <= 3,
                "P rounded to bf16, to 16 bits in two pieces, or exact in three");
  extern __shared__ __align__(16) unsigned char smem[];
  uint16_t* q_s = reinterpret_cast<uint16_t*>(smem);                        // [32][kStride]
  uint16_t* k_s = q_s + kMmaHeads * kStride;                                // [2][64][kStride]
  float* s_s = reinterpret_cast<float*>(k_s + 2 * kTile * kStride);         // [32][kSStride]
  uint16_t* p_s = reinterpret_cast<uint16_t*>(s_s + kMmaHeads * kSStride);  // [kPieces][32][kPStride]
  float* m_s = reinterpret_cast<float*>(p_s + kPieces * kMmaHeads * kPStride);  // [32] running max
  float* l_s = m_s + kMmaHeads;                                             // [32] running sum
  float* a_s = l_s + kMmaHeads;                                             // [32] rescale of this tile

  const int b = blockIdx.z, split = blockIdx.y, h0 = blockIdx.x * kMmaHeads;
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32, mt = warp / 4, wq = warp % 4;
  const int n = p.ctx_len[b], t_begin = split * split_len, t_end = min(n, t_begin + split_len);
  const int n_tiles = t_end > t_begin ? (t_end - t_begin + kTile - 1) / kTile : 0;

  if (n_tiles > 0) load_tile(p, b, t_begin, t_end, k_s);
  for (int c = tid; c < kMmaHeads * kChunks; c += kMmaThreads) {  // q (bf16) once; zero rows past n_head
    const int r = c / kChunks, part = c % kChunks;
    uint4 v = make_uint4(0, 0, 0, 0);
    if (h0 + r < p.n_head)
      v = *reinterpret_cast<const uint4*>(p.q + (size_t(b) * p.n_head + h0 + r) * kMlaRow + part * 8);
    *reinterpret_cast<uint4*>(q_s + r * kStride + part * 8) = v;
  }
  if (tid < kMmaHeads) m_s[tid] = -INFINITY, l_s[tid] = 0.f;

  float acc[16][4];
#pragma unroll
  for (int j = 0; j < 16; ++j) acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.f;

  for (int it = 0; it < n_tiles; ++it) {
    const int t0 = t_begin + it * kTile;
    const uint16_t* rows = k_s + (it % 2) * kTile * kStride;
    if (it + 1 < n_tiles) {
      load_tile(p, b, t0 + kTile, t_end, k_s + ((it + 1) % 2) * kTile * kStride);
      asm volatile("cp.async.wait_group 1;\n");
    } else {
      asm volatile("cp.async.wait_group 0;\n");
    }
    __syncthreads();
    // S = scale * Q K^T for heads mt*16.., tokens wq*16 .. +16
    float sc[2][4] = {}, sc_odd[2][4] = {};  // even / odd k-steps: two mma chains per n-tile (latency)
    {
      const uint32_t qa = smem_addr(q_s + (mt * 16 + (lane & 15)) * kStride + (lane >> 4) * 8);
      const uint32_t ka =
          smem_addr(rows + (wq * 16 + (lane & 7) + ((lane >> 4) << 3)) * kStride + ((lane >> 3) & 1) * 8);
#pragma unroll 4
      for (int kk = 0; kk < kMlaRow / 16; ++kk) {
        uint32_t a[4], bb[4];
        ldsm_x4(qa + kk * 32, a);
        ldsm_x4(ka + kk * 32, bb);
        mma_bf16(kk % 2 ? sc_odd[0] : sc[0], a, bb[0], bb[1]);
        mma_bf16(kk % 2 ? sc_odd[1] : sc[1], a, bb[2], bb[3]);
      }
#pragma unroll
      for (int nt = 0; nt < 2; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) sc[nt][e] += sc_odd[nt][e];
    }
#pragma unroll
    for (int nt = 0; nt < 2; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int row = mt * 16 + lane / 4 + (e / 2) * 8, col = wq * 16 + nt * 8 + (lane % 4) * 2 + e % 2;
        s_s[row * kSStride + col] = t0 + col < t_end ? sc[nt][e] * p.scale : -INFINITY;
      }
    __syncthreads();
    {  // online softmax: 8 threads per head row, 8 tokens each
      const int r = tid / 8, j = tid % 8;
      float v[8], mx = -INFINITY;
#pragma unroll
      for (int i = 0; i < 8; ++i) mx = fmaxf(mx, v[i] = s_s[r * kSStride + j * 8 + i]);
      for (int o = 1; o < 8; o <<= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
      const float m_old = m_s[r], m_new = fmaxf(m_old, mx);  // finite: a tile holds >= 1 valid token
      float sum = 0.f;
#pragma unroll
      for (int i = 0; i < 8; ++i) {
        const float e = __expf(v[i] - m_new);
        const __nv_bfloat16 pb = __float2bfloat16_rn(e);
        __nv_bfloat16* pp = reinterpret_cast<__nv_bfloat16*>(p_s) + r * kPStride + j * 8 + i;
        pp[0] = pb;
        if constexpr (kPieces >=
                      2) {  // e = hi + mid + lo exactly; the sum is the fp32 one, as attention_cpu's
          const float r1 = e - __bfloat162float(pb);  // exact (Sterbenz), <= 16 significant bits
          const __nv_bfloat16 mid = __float2bfloat16_rn(r1);
          pp[kMmaHeads * kPStride] = mid;
          if constexpr (kPieces == 3)
            pp[2 * kMmaHeads * kPStride] =
                __float2bfloat16_rn(r1 - __bfloat162float(mid));  // <= 8 bits: exact
          sum += e;
        } else {
          sum += __bfloat162float(pb);
        }
      }
      for (int o = 1; o < 8; o <<= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
      __syncwarp();
      if (j == 0) {
        const float alpha = __expf(m_old - m_new);  // m_old = -inf -> 0
        a_s[r] = alpha, m_s[r] = m_new, l_s[r] = l_s[r] * alpha + sum;
      }
    }
    __syncthreads();
    {  // O = alpha O + P V for heads mt*16.., dims wq*128 .. +128
      const float al0 = a_s[mt * 16 + lane / 4], al1 = a_s[mt * 16 + lane / 4 + 8];
#pragma unroll
      for (int j = 0; j < 16; ++j) acc[j][0] *= al0, acc[j][1] *= al0, acc[j][2] *= al1, acc[j][3] *= al1;
      const uint32_t pa = smem_addr(p_s + (mt * 16 + (lane & 15)) * kPStride + (lane >> 4) * 8);
      const uint32_t va =
          smem_addr(rows + ((lane & 7) + ((lane >> 3) & 1) * 8) * kStride + wq * 128 + (lane >> 4) * 8);
#pragma unroll
      for (int kk = 0; kk < kTile / 16; ++kk) {
        uint32_t a[kPieces][4];
#pragma unroll
        for (int pc = 0; pc < kPieces; ++pc) ldsm_x4(pa + pc * (kMmaHeads * kPStride * 2) + kk * 32, a[pc]);
#pragma unroll
        for (int jp = 0; jp < 8; ++jp) {
          uint32_t bb[4];
          ldsm_x4_trans(va + (kk * 16 * kStride + jp * 16) * 2, bb);
#pragma unroll
          for (int pc = kPieces - 1; pc >= 0; --pc) {  // smallest piece first
            mma_bf16(acc[2 * jp], a[pc], bb[0], bb[1]);
            mma_bf16(acc[2 * jp + 1], a[pc], bb[2], bb[3]);
          }
        }
      }
    }
    __syncthreads();  // rows and p_s are rewritten next tile
  }
  const size_t base = (size_t(b) * n_split + split) * p.n_head;
#pragma unroll
  for (int j = 0; j < 16; ++j)
#pragma unroll
    for (int e2 = 0; e2 < 2; ++e2) {
      const int h = h0 + mt * 16 + lane / 4 + e2 * 8, d = wq * 128 + j * 8 + (lane % 4) * 2;
      if (h < p.n_head)
        *reinterpret_cast<float2*>(part_o + (base + h) * kMlaLatent + d) =
            make_float2(acc[j][2 * e2], acc[j][2 * e2 + 1]);
    }
  if (tid < kMmaHeads && h0 + tid < p.n_head) {
    part_ml[(base + h0 + tid) * 2] = m_s[tid];
    part_ml[(base + h0 + tid) * 2 + 1] = l_s[tid];
  }
}

template <int kPieces>
void launch_pieces(const MlaDecodeParams& p, const Split& s, float* part_o, float* part_ml, cudaStream_t st) {
  static const bool attr = [] {
    K3_CUDA_ASSERT(cudaFuncSetAttribute(mla_split_mma<kPieces>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                        int(mma_smem(kPieces))));
    return true;
  }();
  (void)attr;
  const dim3 grid((p.n_head + kMmaHeads - 1) / kMmaHeads, s.n_split, p.n_seq);
  mla_split_mma<kPieces>
      <<<grid, kMmaThreads, mma_smem(kPieces), st>>>(p, s.n_split, s.split_len, part_o, part_ml);
  K3_CUDA_LAUNCH_CHECK();
}

}  // namespace

void launch_split_mma(const MlaDecodeParams& p, const Split& s, float* part_o, float* part_ml,
                      cudaStream_t st) {
  if (p.exact_p && env_value("K3_MLA_EXACT_PIECES") == "3")  // read per call (bench_dsa): exact P
    launch_pieces<3>(p, s, part_o, part_ml, st);
  else if (p.exact_p)
    launch_pieces<2>(p, s, part_o, part_ml, st);
  else
    launch_pieces<1>(p, s, part_o, part_ml, st);
}

}  // namespace k3::mla_detail
