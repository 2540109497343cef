// kda_fast_prefill.cuh: what the two prefill kernels share (kda_fast_prefill_intra.cu writes the per-chunk
// scratch, kda_fast_prefill_state.cu walks the chunks with the state): the tf32 MMA, the scratch layout and
// the map from a padded chunk index to (sequence, chunk).
//
// Chunks (C = 64 tokens) are numbered over the batch: sequence s owns ceil(len_s / 64) consecutive chunk
// indices from chunk_base(s); a sequence's last chunk is padded with zero rows (q = k = v = g = beta = 0,
// which add nothing to A, T, W, U or the state). The host knows only the bound n_tok / 64 + n_seq on the
// number of chunks, never the count itself (no device-to-host read): kernels return early past the end.
//
// Scratch per (chunk c, head h), 32-bit words. The operands whose range the contract bounds (q, k unit rows,
// so |Qe|, |Kd|, |A| <= 1; T and W are O(1)) are stored as fp16, which has tf32's 10 mantissa bits: widened
// to fp32 they are exact tf32 values, so the tf32 MMAs see what an fp32 scratch rounded to tf32 would give
// (values under fp16's normal range, 6e-5, keep an absolute error below 3e-8). Each matrix is stored as
// mma.sync m16n8k8 A fragments in register order, two k-steps per 16-byte load: lane's uint4 =
// {half2(a0, a1), half2(a2, a3)} of k-step 2p, then of k-step 2p + 1.
//   QE [4 mt][8 p][32 lanes]  Qe = exp(G) q                      [64 x 128]
//   WN [4 mt][8 p][32 lanes]  -W = -T (beta exp(G) k)            [64 x 128]
//   KT [8 mt][4 p][32 lanes]  Kd^T, Kd = exp(G_C - G) k          [128 x 64]
//   AF [4 mt][4 p][32 lanes]  A (masked j <= i)                  [64 x 64], k-steps above the diagonal unset
//   TF [4 mt][4 p][32 lanes]  T = (I + L)^-1 (lower triangular)  [64 x 64], same
//   DC [128] fp32             exp(G_C), the chunk's decay per key channel
// U = T (beta V) is not stored: the state kernel forms it from T and its own columns of v.
// G = in-chunk cumulative log-decay (kda.h's WY form). Lane l: g = l / 4, t = l % 4;
// A fragment: (g, t), (g+8, t), (g, t+4), (g+8, t+4); C: (g, 2t), (g, 2t+1), (g+8, 2t), (g+8, 2t+1);
// B: (k = t, n = g), (t+4, g).
#pragma once

#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "ops/kda_fast.h"

namespace k3::kdapre {

constexpr int C = 64, DK = 128;
constexpr int OFF_QE = 0, OFF_WN = OFF_QE + C * DK / 2, OFF_KT = OFF_WN + C * DK / 2, OFF_AF = OFF_KT + C * DK / 2;
constexpr int OFF_TF = OFF_AF + C * C / 2, OFF_DC = OFF_TF + C * C / 2, CHUNK_WORDS = OFF_DC + DK;
constexpr size_t CHUNK_BYTES = size_t(CHUNK_WORDS) * 4;  // 66,048 bytes per (chunk, head)

// uint4 index of the k-step pair p of tile `tile` (n_pair pairs per tile) for this lane.
// T_aa = (I + L_aa)^-1 of the four 16x16 diagonal blocks of a unit lower triangular 64x64 L (row stride
// LD), by forward substitution: threads 0-63, one column c of block a each (the caller guards tid < 64).
template <int LD>
__device__ __forceinline__ void invert_diag(const float* L, float* T) {
  const int tid = threadIdx.x;
  const int a = tid >> 4, c = tid & 15;
  float x[16];
#pragma unroll
  for (int r = 0; r < 16; ++r) {
    float s = r == c ? 1.f : 0.f;
#pragma unroll
    for (int j = 0; j < r; ++j) s -= L[(16 * a + r) * LD + 16 * a + j] * x[j];
    x[r] = s;
    T[(16 * a + r) * LD + 16 * a + c] = s;
  }
}
__device__ __forceinline__ int frag_at(int tile, int pair, int n_pair, int lane) {
  return (tile * n_pair + pair) * 32 + lane;
}
__device__ __forceinline__ uint32_t pack_h2(float lo, float hi) {
  const __half2 h = __floats2half2_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&h);
}
// Two k-steps of fp16 A fragments -> tf32 A fragments (exact).
__device__ __forceinline__ void unpack_a(const uint4& u, uint32_t (&a0)[4], uint32_t (&a1)[4]) {
  const uint32_t w[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float2 f = __half22float2(*reinterpret_cast<const __half2*>(&w[i]));
    uint32_t* dst = i < 2 ? a0 : a1;
    dst[2 * (i & 1)] = __float_as_uint(f.x), dst[2 * (i & 1) + 1] = __float_as_uint(f.y);
  }
}

// tf32 rounding, nearest with ties away from zero: cvt.rna.tf32.f32 (three SASS instructions on sm_90: a
// finiteness test, a predicated add, the mask), or with KDA_TF32_ADD_MASK=1 one add and one mask, the host
// emulation's tf32(): equal for every finite x below 2^128 (1 - 2^-11), which every operand here is (bounded
// by the contract); the pre-pass loses 320 of its 5512 static instructions. The default since session 19
// (H100: pre-pass T = 8192 1.358 -> 1.333 ms, every fp64 check digit the same); =0 for cvt.rna.
#ifndef KDA_TF32_ADD_MASK
#define KDA_TF32_ADD_MASK 1
#endif
__device__ __forceinline__ uint32_t to_tf32(float x) {
#if KDA_TF32_ADD_MASK
  return (__float_as_uint(x) + 0x1000u) & 0xffffe000u;
#else
  uint32_t r;
  asm("cvt.rna.tf32.f32 %0, %1;" : "=r"(r) : "f"(x));
  return r;
#endif
}
__device__ __forceinline__ void mma_tf32(float (&c)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
  asm volatile(
      "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}
// A operand from shared memory, A[m][k] = X[(row0 + m) * ld + k0 + k] (row-major, fp32 rounded here).
__device__ __forceinline__ void lds_a(uint32_t (&a)[4], const float* X, int ld, int row0, int k0) {
  const int l = threadIdx.x & 31, g = l >> 2, t = l & 3;
  const float* x = X + (row0 + g) * ld + k0 + t;
  a[0] = to_tf32(x[0]), a[1] = to_tf32(x[8 * ld]), a[2] = to_tf32(x[4]), a[3] = to_tf32(x[8 * ld + 4]);
}
// B operand, B[k][n] = X[(k0 + k) * ld + n0 + n] (fp32 rounded here).
__device__ __forceinline__ void lds_b_kn(uint32_t (&b)[2], const float* X, int ld, int k0, int n0) {
  const int l = threadIdx.x & 31, g = l >> 2, t = l & 3;
  const float* x = X + (k0 + t) * ld + n0 + g;
  b[0] = to_tf32(x[0]), b[1] = to_tf32(x[4 * ld]);
}
// B operand, B[k][n] = X[(n0 + n) * ld + k0 + k] (X holds B transposed: the product is A X^T).
__device__ __forceinline__ void lds_b_nk(uint32_t (&b)[2], const float* X, int ld, int k0, int n0) {
  const int l = threadIdx.x & 31, g = l >> 2, t = l & 3;
  const float* x = X + (n0 + g) * ld + k0 + t;
  b[0] = to_tf32(x[0]), b[1] = to_tf32(x[4]);
}
// B operand from words already in tf32, B[k][n] = X[(k0 + k) * ld + n0 + n].
__device__ __forceinline__ void lds_b_kn_u(uint32_t (&b)[2], const uint32_t* X, int ld, int k0, int n0) {
  const int l = threadIdx.x & 31, g = l >> 2, t = l & 3;
  const uint32_t* x = X + (k0 + t) * ld + n0 + g;
  b[0] = x[0], b[1] = x[4 * ld];
}

// One 16-wide k-step over NTL n-tiles: acc[j] (16 x 8) += A (16 x 16, packed fp16 pair as unpack_a takes it)
// X[k0 .. k0 + 16, 8 j .. 8 j + 8] (tf32 words in shared memory, row stride ld).
template <int NTL>
__device__ __forceinline__ void mma_k16(float (&acc)[NTL][4], const uint4& a, const uint32_t* X, int ld, int k0) {
  uint32_t a0[4], a1[4];
  unpack_a(a, a0, a1);
#pragma unroll
  for (int j = 0; j < NTL; ++j) {
    uint32_t b0[2], b1[2];
    lds_b_kn_u(b0, X, ld, k0, 8 * j);
    lds_b_kn_u(b1, X, ld, k0 + 8, 8 * j);
    mma_tf32(acc[j], a0, b0);
    mma_tf32(acc[j], a1, b1);
  }
}

// A 16 x 8 accumulator tile (C layout) as the A fragment of one k-step (the tile's 8 columns are the k
// index), through warp shuffles: lane (g, t) takes columns t and t + 4 of rows g and g + 8. Returns
// {half2(a0, a1), half2(a2, a3)}.
__device__ __forceinline__ uint2 c_to_a_h(const float (&c)[4]) {
  const int l = threadIdx.x & 31, g = l >> 2, t = l & 3;
  const int src0 = 4 * g + (t >> 1), src1 = src0 + 2;  // holders of columns t and t + 4
  const float r0c0 = __shfl_sync(0xffffffffu, c[0], src0), r0c1 = __shfl_sync(0xffffffffu, c[1], src0);
  const float r1c0 = __shfl_sync(0xffffffffu, c[2], src0), r1c1 = __shfl_sync(0xffffffffu, c[3], src0);
  const float s0c0 = __shfl_sync(0xffffffffu, c[0], src1), s0c1 = __shfl_sync(0xffffffffu, c[1], src1);
  const float s1c0 = __shfl_sync(0xffffffffu, c[2], src1), s1c1 = __shfl_sync(0xffffffffu, c[3], src1);
  const bool odd = t & 1;
  return make_uint2(pack_h2(odd ? r0c1 : r0c0, odd ? r1c1 : r1c0), pack_h2(odd ? s0c1 : s0c0, odd ? s1c1 : s1c0));
}

// Sequence and first token of padded chunk index c; false past the last chunk. Every thread runs it (the
// loop is over sequences, n_seq reads of cu_seqlens that stay in L1).
struct ChunkPos {
  int seq, n;         // sequence, valid rows (1..64)
  int64_t t0;         // first token
  bool first, last;   // the sequence's first / last chunk
};
__device__ inline bool chunk_pos(const KdaPrefillParams& p, int64_t c, ChunkPos& out) {
  int64_t base = 0;
  for (int s = 0; s < p.n_seq; ++s) {
    const int64_t a = p.cu_seqlens[s], len = p.cu_seqlens[s + 1] - a, nc = (len + C - 1) / C;
    if (c < base + nc) {
      const int64_t j = c - base;
      out.seq = s, out.t0 = a + j * C, out.n = int(len - j * C < C ? len - j * C : C);
      out.first = j == 0, out.last = j == nc - 1;
      return true;
    }
    base += nc;
  }
  return false;
}

}  // namespace k3::kdapre
