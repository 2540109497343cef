// kda_fast_prefill.cu: chunkwise KDA prefill for d_k = d_v = 128 (kda_fast.h), tf32 tensor-core MMAs: the
// one-kernel version measured on the H200 in session 2 (T = 8192: 5.41 ms, o rel-RMS 1.35e-3), now the
// cross-check of the default two-kernel version (kda_fast_prefill_intra.cu + kda_fast_prefill_state.cu, 1.5x
// faster); kda_prefill_fast_cuda (kda_fast_prefill_state.cu) calls it with K3_KDA_PREFILL_SPLIT=0.
//
// One CTA (8 warps) per (half of V, head, sequence) walks the sequence's chunks of C = 64 tokens with the
// fp32 state slice S [128, 64] in shared memory. Per chunk, G = in-chunk cumsum of g:
//   1. A[i,j] = q_i.k_j exp(G_i - G_j) (j <= i), L[i,j] = beta_i k_i.k_j exp(G_i - G_j) (j < i), per 16-row
//      block a with reference R = G_{16a}: rows q_i exp(G_i - R) (>= e^-75 by the gate bound), columns
//      k_j exp(R - G_j) (<= e^75 inside the block, <= 1 before it): dense MMAs, no overflow.
//   2. T = (I + L)^-1: four 16x16 diagonal inverses by substitution, then the blocks below them.
//   3. V' = T (beta V - (beta exp(G) K) S);  O = (exp(G) Q) S + A V';  S <- exp(G_C) S + Kd^T V'.
// The next chunk's inputs are loaded into registers while the MMAs of step 3 run.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <string>

#include "core/cuda_check.h"
#include "ops/kda_fast.h"
#include "ops/kda_fast_prefill.cuh"  // kdapre::invert_diag

namespace k3 {
namespace {

// mma.sync m16n8k8 tf32 (fp32 accumulate). Lane l: g = l / 4, t = l % 4. A fragment: (g, t), (g+8, t),
// (g, t+4), (g+8, t+4); B: (k = t, n = g), (t+4, g); C: (g, 2t), (g, 2t+1), (g+8, 2t), (g+8, 2t+1).
__device__ inline uint32_t to_tf32(float x) {
  uint32_t r;
  asm("cvt.rna.tf32.f32 %0, %1;" : "=r"(r) : "f"(x));
  return r;
}
__device__ inline void mma_tf32(float (&c)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
  asm volatile(
      "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}
// A[m][k] = X[(row0 + m) * ld + k0 + k] (row-major).
__device__ inline void mma_load_a(uint32_t (&a)[4], const float* X, int ld, int row0, int k0) {
  const int l = threadIdx.x & 31, g = l >> 2, t = l & 3;
  const float* x = X + (row0 + g) * ld + k0 + t;
  a[0] = to_tf32(x[0]);
  a[1] = to_tf32(x[8 * ld]);
  a[2] = to_tf32(x[4]);
  a[3] = to_tf32(x[8 * ld + 4]);
}
// A[m][k] = X[(k0 + k) * ld + row0 + m] (X holds A transposed).
__device__ inline void mma_load_a_t(uint32_t (&a)[4], const float* X, int ld, int row0, int k0) {
  const int l = threadIdx.x & 31, g = l >> 2, t = l & 3;
  const float* x = X + (k0 + t) * ld + row0 + g;
  a[0] = to_tf32(x[0]);
  a[1] = to_tf32(x[8]);
  a[2] = to_tf32(x[4 * ld]);
  a[3] = to_tf32(x[4 * ld + 8]);
}
// B[k][n] = X[(k0 + k) * ld + n0 + n].
__device__ inline void mma_load_b_kn(uint32_t (&b)[2], const float* X, int ld, int k0, int n0) {
  const int l = threadIdx.x & 31, g = l >> 2, t = l & 3;
  const float* x = X + (k0 + t) * ld + n0 + g;
  b[0] = to_tf32(x[0]);
  b[1] = to_tf32(x[4 * ld]);
}
// B[k][n] = X[(n0 + n) * ld + k0 + k] (X holds B transposed: the product is A X^T).
__device__ inline void mma_load_b_nk(uint32_t (&b)[2], const float* X, int ld, int k0, int n0) {
  const int l = threadIdx.x & 31, g = l >> 2, t = l & 3;
  const float* x = X + (n0 + g) * ld + k0 + t;
  b[0] = to_tf32(x[0]);
  b[1] = to_tf32(x[4]);
}

#ifndef KDA_FAST_NT
#define KDA_FAST_NT 512
#endif
#ifndef KDA_FAST_INV_DOUBLING
#define KDA_FAST_INV_DOUBLING 0
#endif
#ifndef KDA_FAST_AL_PAIRS  // A, L: each warp two adjacent column tiles (half the A-operand reads)
#define KDA_FAST_AL_PAIRS 0
#endif
#ifndef KDA_FAST_OW  // warps on the [64, 64] products of phase 4 (fewer warps: less shared-memory traffic)
#define KDA_FAST_OW NW
#endif
constexpr int C = 64, DK = 128, VB = 64, NT = KDA_FAST_NT, NW = NT / 32;
static_assert(NW == 8 || NW == 16, "8 or 16 warps");
constexpr int NQ = C * DK / 8 / NT, NV = C * VB / 8 / NT;  // 16-byte loads per thread: q, k, g; v
constexpr int LDR = 132;  // rows read as MMA A operand (row-major) or B given as [n][k]
constexpr int LDK = 136;  // Kd, read as A^T ([k][m])
constexpr int LDV = 72;   // [k][n] B operands with 64 columns: S, Y, V'
constexpr int LDC = 68;   // 64x64 matrices A, L, T
// Shared memory, in floats (regions reused across the phases; see the comments at each use).
constexpr int OFF_S = 0;                  // S [128][LDV]
constexpr int OFF_G = OFF_S + DK * LDV;   // G [64][LDR] -> Qe = exp(G) q
constexpr int OFF_KB = OFF_G + C * LDR;   // Kc [64][LDR] (phase 1) -> Bk = beta exp(G) k
constexpr int OFF_KD = OFF_KB + C * LDR;  // L [64][LDC] + Qr, Kr [16][LDR] (phase 1-2) -> Kd [64][LDK]
constexpr int OFF_A = OFF_KD + C * LDK;   // A [64][LDC]
constexpr int OFF_T = OFF_A + C * LDC;    // T [64][LDC]
constexpr int OFF_QV = OFF_T + C * LDC;   // q, k raw bf16 [64][128] each -> Y [64][LDV], V' [64][LDV]
constexpr int OFF_BETA = OFF_QV + 2 * C * LDV;
constexpr int OFF_GC = OFF_BETA + C;    // G_C [128], exp(G_C) [128]
constexpr int OFF_P = OFF_GC + 2 * DK;  // scratch [3][16][16] for the blocked inverse
constexpr int SMEM_FLOATS = OFF_P + 3 * 256;
static_assert(C * LDC + 2 * 16 * LDR <= C * LDK, "L, Qr, Kr fit the Kd region");
static_assert(C * DK <= 2 * C * LDV, "raw q, k (bf16) fit the Y, V' region");

// Profile builds (-DKDA_FAST_PROFILE): thread 0 of CTA (0, 0, 0) adds the clock64() cycles of each phase
// (up to its closing barrier) to kda_prof[]; bench_kda reads them through kda_fast_profile_read().
#ifdef KDA_FAST_PROFILE
__device__ unsigned long long kda_prof[8];
#define PROF(i)                                                            \
  if (tid == 0 && blockIdx.x == 0 && blockIdx.y == 0 && blockIdx.z == 0) { \
    const long long now_ = clock64();                                      \
    kda_prof[i] += now_ - prof_last;                                       \
    prof_last = now_;                                                      \
  }
#else
#define PROF(i)
#endif

// Inputs of one chunk held in registers (prefetch): 4 x 16 B of q, k, g, 2 x 16 B of v, one beta.
struct ChunkRegs {
  uint4 q[NQ], k[NQ], g[NQ], v[NV];
  float beta;
};

__device__ inline void load_chunk(ChunkRegs& r, const KdaPrefillParams& p, int64_t t0, int n, int h, int vh) {
  const int tid = threadIdx.x, H = p.n_head;
  const uint4 zero = make_uint4(0, 0, 0, 0);
#pragma unroll
  for (int m = 0; m < NQ; ++m) {
    const int idx = tid + NT * m, row = idx >> 4, c8 = idx & 15;
    const size_t off = (size_t(t0 + row) * H + h) * DK + c8 * 8;
    const bool in = row < n;
    r.q[m] = in ? __ldg(reinterpret_cast<const uint4*>(p.q + off)) : zero;
    r.k[m] = in ? __ldg(reinterpret_cast<const uint4*>(p.k + off)) : zero;
    r.g[m] = in ? __ldg(reinterpret_cast<const uint4*>(p.g + off)) : zero;
  }
#pragma unroll
  for (int m = 0; m < NV; ++m) {
    const int idx = tid + NT * m, row = idx >> 3, c8 = idx & 7;
    const size_t off = (size_t(t0 + row) * H + h) * 128 + vh * VB + c8 * 8;
    r.v[m] = row < n ? __ldg(reinterpret_cast<const uint4*>(p.v + off)) : zero;
  }
  r.beta = tid < n ? __ldg(p.beta + size_t(t0 + tid) * H + h) : 0.f;
}

__device__ inline void bf16x8_to_f32(const uint4& u, float* out) {
  const uint32_t w[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    out[2 * i] = __uint_as_float(w[i] << 16);
    out[2 * i + 1] = __uint_as_float(w[i] & 0xffff0000u);
  }
}

__device__ inline float bf16_at(const uint16_t* base, int i) {
  return __uint_as_float(uint32_t(base[i]) << 16);
}

// Phase 1: A and L, one 16-row block a at a time. Each thread keeps one channel d (NT is a multiple of 128).
// The column factors of the earlier blocks move from reference R_{a-1} to R_a by one factor
// exp(R_a - R_{a-1}) <= 1 instead of new exps.
template <int a>
__device__ __forceinline__ void intra_chunk(float* sm) {
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, d = tid & 127, r0 = tid >> 7;
  constexpr int RS = NT / 128;  // rows per pass
  const float* G = sm + OFF_G;
  const uint16_t* Qb = reinterpret_cast<const uint16_t*>(sm + OFF_QV);
  const uint16_t* Kb = Qb + C * DK;
  float* Kc = sm + OFF_KB;
  float* L = sm + OFF_KD;
  float* Qr = L + C * LDC;
  float* Kr = Qr + 16 * LDR;
  float* A = sm + OFF_A;
  const float* beta = sm + OFF_BETA;
  const float Rd = G[16 * a * LDR + d];
#pragma unroll
  for (int r = r0; r < 16; r += RS) {  // rows of block a against their reference
    const int i = 16 * a + r;
    const float f = __expf(G[i * LDR + d] - Rd);
    Qr[r * LDR + d] = bf16_at(Qb, i * DK + d) * f;
    Kr[r * LDR + d] = bf16_at(Kb, i * DK + d) * f;
  }
  if constexpr (a > 0) {
    const float f = __expf(Rd - G[16 * (a - 1) * LDR + d]);
#pragma unroll
    for (int j = r0; j < 16 * a; j += RS) Kc[j * LDR + d] *= f;
  }
#pragma unroll
  for (int j = 16 * a + r0; j < 16 * (a + 1); j += RS)  // columns of block a
    Kc[j * LDR + d] = bf16_at(Kb, j * DK + d) * __expf(Rd - G[j * LDR + d]);
  constexpr int n_col = 16 * (a + 1), n_zero = C - n_col;
  if constexpr (n_zero > 0) {
    for (int e = tid; e < 16 * n_zero; e += NT) {  // the rest of the rows of A and L is zero
      const int r = e / n_zero, j = n_col + e % n_zero;
      A[(16 * a + r) * LDC + j] = 0.f;
      L[(16 * a + r) * LDC + j] = 0.f;
    }
  }
  __syncthreads();
  const int g = lane >> 2, t = lane & 3;
#if KDA_FAST_AL_PAIRS
  constexpr int n_pair = a + 1;  // jobs: 16 columns of A or of L; the A fragment serves two MMAs
  for (int job = warp; job < 2 * n_pair; job += NW) {
    const bool is_l = job >= n_pair;
    const int j0 = 16 * (job % n_pair);
    const float* X = is_l ? Kr : Qr;
    float acc[2][4] = {}, acc2[2][4] = {};
#pragma unroll
    for (int k0 = 0; k0 < DK; k0 += 16) {
      uint32_t af[4], af2[4];
      mma_load_a(af, X, LDR, 0, k0);
      mma_load_a(af2, X, LDR, 0, k0 + 8);
#pragma unroll
      for (int u = 0; u < 2; ++u) {
        uint32_t bf[2], bf2[2];
        mma_load_b_nk(bf, Kc, LDR, k0, j0 + 8 * u);
        mma_load_b_nk(bf2, Kc, LDR, k0 + 8, j0 + 8 * u);
        mma_tf32(acc[u], af, bf);
        mma_tf32(acc2[u], af2, bf2);
      }
    }
#pragma unroll
    for (int u = 0; u < 2; ++u)
#pragma unroll
      for (int c = 0; c < 4; ++c) {
        const int i = 16 * a + g + 8 * (c >> 1), j = j0 + 8 * u + 2 * t + (c & 1);
        const float x = acc[u][c] + acc2[u][c];
        if (is_l)
          L[i * LDC + j] = j < i ? beta[i] * x : 0.f;
        else
          A[i * LDC + j] = j <= i ? x : 0.f;
      }
  }
#else
  constexpr int n_tile = 2 * (a + 1);
  for (int tile = warp; tile < 2 * n_tile; tile += NW) {
    const bool is_l = tile >= n_tile;
    const int j0 = 8 * (tile % n_tile);
    const float* X = is_l ? Kr : Qr;
    float acc[4] = {0.f, 0.f, 0.f, 0.f}, acc2[4] = {0.f, 0.f, 0.f, 0.f};  // two chains of 8 MMAs
#pragma unroll
    for (int k0 = 0; k0 < DK; k0 += 16) {
      uint32_t af[4], bf[2], af2[4], bf2[2];
      mma_load_a(af, X, LDR, 0, k0);
      mma_load_b_nk(bf, Kc, LDR, k0, j0);
      mma_load_a(af2, X, LDR, 0, k0 + 8);
      mma_load_b_nk(bf2, Kc, LDR, k0 + 8, j0);
      mma_tf32(acc, af, bf);
      mma_tf32(acc2, af2, bf2);
    }
#pragma unroll
    for (int c = 0; c < 4; ++c) {
      const int i = 16 * a + g + 8 * (c >> 1), j = j0 + 2 * t + (c & 1);
      const float x = acc[c] + acc2[c];
      if (is_l)
        L[i * LDC + j] = j < i ? beta[i] * x : 0.f;
      else
        A[i * LDC + j] = j <= i ? x : 0.f;
    }
  }
#endif
  __syncthreads();
}

// Phase 2: T = (I + L)^-1 (unit lower triangular), 16x16 blocks: T_aa by substitution, then
// T_ab = -T_aa sum_{c=b}^{a-1} L_ac T_cb by distance a - b.
__device__ void invert(float* sm) {
  const int tid = threadIdx.x;
  const float* L = sm + OFF_KD;
  float* T = sm + OFF_T;
  float* P = sm + OFF_P;
#if KDA_FAST_INV_DOUBLING
  // T_aa = (I + N)^-1 = (I - N)(I + N^2)(I + N^4)(I + N^8) for N = L_aa (strictly lower, N^16 = 0): four
  // stages of 16x16 products, every element its own thread, instead of a 16-step substitution chain.
  // Scratch in the Kc region (dead after phase 1, Bk not yet written): [m][a][16][16], m = N2, N4, N8, X.
  float* W = sm + OFF_KB;
  auto Nm = [&](int a, int r, int x) { return L[(16 * a + r) * LDC + 16 * a + x]; };
  auto Wm = [&](int m, int a) { return W + (m * 4 + a) * 256; };
  for (int e = tid; e < 1024; e += NT) {  // N2 = N N
    const int a = e >> 8, r = (e >> 4) & 15, c = e & 15;
    float s = 0.f;
#pragma unroll
    for (int x = 0; x < 16; ++x) s += Nm(a, r, x) * Nm(a, x, c);
    Wm(0, a)[r * 16 + c] = s;
  }
  for (int e = tid; e < 6 * 256; e += NT) {  // blocks above the diagonal are zero
    const int blk = e >> 8, r = (e >> 4) & 15, c = e & 15;
    const int a = blk < 3 ? 0 : (blk < 5 ? 1 : 2), b = blk < 3 ? blk + 1 : (blk < 5 ? blk - 1 : 3);
    T[(16 * a + r) * LDC + 16 * b + c] = 0.f;
  }
  __syncthreads();
  for (int e = tid; e < 2048; e += NT) {  // X = (I - N)(I + N2) = I - N + N2 - N N2;  N4 = N2 N2
    const int which = e >> 10, a = (e >> 8) & 3, r = (e >> 4) & 15, c = e & 15;
    const float* N2 = Wm(0, a);
    float s = 0.f;
    if (which == 0) {
#pragma unroll
      for (int x = 0; x < 16; ++x) s += Nm(a, r, x) * N2[x * 16 + c];
      Wm(3, a)[r * 16 + c] = (r == c ? 1.f : 0.f) - Nm(a, r, c) + N2[r * 16 + c] - s;
    } else {
#pragma unroll
      for (int x = 0; x < 16; ++x) s += N2[r * 16 + x] * N2[x * 16 + c];
      Wm(1, a)[r * 16 + c] = s;
    }
  }
  __syncthreads();
  for (int e = tid; e < 2048; e += NT) {  // X (I + N4) -> N2's place;  N8 = N4 N4
    const int which = e >> 10, a = (e >> 8) & 3, r = (e >> 4) & 15, c = e & 15;
    const float *N4 = Wm(1, a), *X = Wm(3, a);
    float s = 0.f;
    if (which == 0) {
#pragma unroll
      for (int x = 0; x < 16; ++x) s += X[r * 16 + x] * N4[x * 16 + c];
      Wm(0, a)[r * 16 + c] = X[r * 16 + c] + s;
    } else {
#pragma unroll
      for (int x = 0; x < 16; ++x) s += N4[r * 16 + x] * N4[x * 16 + c];
      Wm(2, a)[r * 16 + c] = s;
    }
  }
  __syncthreads();
  for (int e = tid; e < 1024; e += NT) {  // T_aa = X' (I + N8)
    const int a = e >> 8, r = (e >> 4) & 15, c = e & 15;
    const float *X = Wm(0, a), *N8 = Wm(2, a);
    float s = X[r * 16 + c];
#pragma unroll
    for (int x = 0; x < 16; ++x) s += X[r * 16 + x] * N8[x * 16 + c];
    T[(16 * a + r) * LDC + 16 * a + c] = s;
  }
#else
  if (tid < 64) {
    kdapre::invert_diag<LDC>(L, T);
  } else {
    for (int e = tid - 64; e < 6 * 256; e += NT - 64) {  // blocks above the diagonal are zero
      const int blk = e >> 8, r = (e >> 4) & 15, c = e & 15;
      const int a = blk < 3 ? 0 : (blk < 5 ? 1 : 2), b = blk < 3 ? blk + 1 : (blk < 5 ? blk - 1 : 3);
      T[(16 * a + r) * LDC + 16 * b + c] = 0.f;
    }
  }
#endif
  __syncthreads();
  const int r = (tid >> 4) & 15, c = tid & 15;
  const bool on = tid < 256;  // one thread per element of a 16x16 block
  for (int d = 1; d < 4; ++d) {
    for (int b = 0; on && b + d < 4; ++b) {
      const int a = b + d;
      float s = 0.f;
      for (int cc = b; cc < a; ++cc)
#pragma unroll
        for (int x = 0; x < 16; ++x)
          s += L[(16 * a + r) * LDC + 16 * cc + x] * T[(16 * cc + x) * LDC + 16 * b + c];
      P[b * 256 + r * 16 + c] = s;
    }
    __syncthreads();
    for (int b = 0; on && b + d < 4; ++b) {
      const int a = b + d;
      float s = 0.f;
#pragma unroll
      for (int x = 0; x < 16; ++x) s += T[(16 * a + r) * LDC + 16 * a + x] * P[b * 256 + x * 16 + c];
      T[(16 * a + r) * LDC + 16 * b + c] = -s;
    }
    __syncthreads();
  }
}

__global__ void __launch_bounds__(NT, 1) kda_prefill_kernel(const KdaPrefillParams p) {
  extern __shared__ float4 smem_f4[];
  float* sm = reinterpret_cast<float*>(smem_f4);
  const int vh = blockIdx.x, h = blockIdx.y, s = blockIdx.z, tid = threadIdx.x;
  const int warp = tid >> 5, lane = tid & 31, g = lane >> 2, t = lane & 3;
  const int H = p.n_head;
  const int64_t tok0 = p.cu_seqlens[s], tok1 = p.cu_seqlens[s + 1];
  const int slot = p.slot ? p.slot[s] : s;
  float* Sg = p.S + (size_t(slot) * H + h) * DK * 128 + vh * VB;  // [128][128], this CTA's 64 columns
  float* S = sm + OFF_S;
  for (int e = tid; e < DK * VB; e += NT) {
    const int d = e >> 6, c = e & 63;
    S[d * LDV + c] = p.zero_initial_state ? 0.f : Sg[size_t(d) * 128 + c];
  }
  float* G = sm + OFF_G;
  float* Bk = sm + OFF_KB;
  float* Kd = sm + OFF_KD;
  float* A = sm + OFF_A;
  float* T = sm + OFF_T;
  float* Y = sm + OFF_QV;
  float* Vp = Y + C * LDV;
  float* beta = sm + OFF_BETA;
  float* GC = sm + OFF_GC;
  float* decay = GC + DK;
  uint16_t* Qb = reinterpret_cast<uint16_t*>(sm + OFF_QV);
  uint16_t* Kb = Qb + C * DK;

  ChunkRegs in;
#ifdef KDA_FAST_PROFILE
  long long prof_last = clock64();
#endif
  if (tok0 < tok1) load_chunk(in, p, tok0, int(min(int64_t(C), tok1 - tok0)), h, vh);
  for (int64_t t0 = tok0; t0 < tok1; t0 += C) {
    const int n = int(min(int64_t(C), tok1 - t0));
    // Phase 0: the chunk's inputs into shared memory (raw q, k as bf16, g widened), G = cumsum g.
#pragma unroll
    for (int m = 0; m < NQ; ++m) {
      const int idx = tid + NT * m, row = idx >> 4, c8 = idx & 15;
      *reinterpret_cast<uint4*>(Qb + row * DK + c8 * 8) = in.q[m];
      *reinterpret_cast<uint4*>(Kb + row * DK + c8 * 8) = in.k[m];
      float gf[8];
      bf16x8_to_f32(in.g[m], gf);
      *reinterpret_cast<float4*>(G + row * LDR + c8 * 8) = make_float4(gf[0], gf[1], gf[2], gf[3]);
      *reinterpret_cast<float4*>(G + row * LDR + c8 * 8 + 4) = make_float4(gf[4], gf[5], gf[6], gf[7]);
    }
    if (tid < C) beta[tid] = in.beta;
    __syncthreads();
    PROF(0)
    if (tid < DK) {
      float x[C];
#pragma unroll
      for (int i = 0; i < C; ++i) x[i] = G[i * LDR + tid];
      float acc = 0.f;
#pragma unroll
      for (int i = 0; i < C; ++i) {
        acc += x[i];
        G[i * LDR + tid] = acc;
      }
      GC[tid] = acc;
      decay[tid] = __expf(acc);
    }
    __syncthreads();
    PROF(1)
    // Phase 1, 2: A, L; T.
    intra_chunk<0>(sm);
    intra_chunk<1>(sm);
    intra_chunk<2>(sm);
    intra_chunk<3>(sm);
    PROF(2)
    invert(sm);
    PROF(3)
    // Phase 3: Qe = exp(G) q (in place of G), Bk = beta exp(G) k, Kd = exp(G_C - G) k.
    const float GCd = GC[tid & 127];
#pragma unroll 8
    for (int e = tid; e < C * DK; e += NT) {
      const int i = e >> 7, d = e & 127;
      const float Gv = G[i * LDR + d], kv = bf16_at(Kb, i * DK + d), eg = __expf(Gv);
      G[i * LDR + d] = eg * bf16_at(Qb, i * DK + d);
      Bk[i * LDR + d] = beta[i] * eg * kv;
      Kd[i * LDK + d] = __expf(GCd - Gv) * kv;
    }
    __syncthreads();
#pragma unroll
    for (int m = 0; m < NV; ++m) {  // Y region := beta V (raw q, k are dead)
      const int idx = tid + NT * m, row = idx >> 3, c8 = idx & 7;
      float vf[8];
      bf16x8_to_f32(in.v[m], vf);
      const float b = beta[row];
#pragma unroll
      for (int x = 0; x < 8; ++x) Y[row * LDV + c8 * 8 + x] = b * vf[x];
    }
    __syncthreads();
    PROF(4)
    // Prefetch the next chunk while the MMAs below run.
    if (t0 + C < tok1) load_chunk(in, p, t0 + C, int(min(int64_t(C), tok1 - t0 - C)), h, vh);
    // Phase 4a: Y = beta V - Bk S; O = Qe S. Warp tile: rows 16 mi .. + 15, columns n0 .. + 8 ON - 1.
    constexpr int OW = KDA_FAST_OW, ON = 32 / OW;  // warps on, n-tiles of 8 per warp in, the [64, 64] outputs
    const bool o_warp = warp < OW;
    const int mi = warp & 3, n0 = 8 * ON * ((warp >> 2) % (OW / 4));
    float accO[ON][4], accY[ON][4];
#pragma unroll
    for (int j = 0; j < ON; ++j)
#pragma unroll
      for (int c = 0; c < 4; ++c) accO[j][c] = accY[j][c] = 0.f;
    if (o_warp) {
#pragma unroll 2
      for (int k0 = 0; k0 < DK; k0 += 8) {
        uint32_t ab[4], aq[4];
        mma_load_a(ab, Bk + 16 * mi * LDR, LDR, 0, k0);
        mma_load_a(aq, G + 16 * mi * LDR, LDR, 0, k0);
#pragma unroll
        for (int j = 0; j < ON; ++j) {
          uint32_t bf[2];
          mma_load_b_kn(bf, S, LDV, k0, n0 + 8 * j);
          mma_tf32(accY[j], ab, bf);
          mma_tf32(accO[j], aq, bf);
        }
      }
#pragma unroll
      for (int j = 0; j < ON; ++j)
#pragma unroll
        for (int c = 0; c < 4; ++c) {
          const int i = 16 * mi + g + 8 * (c >> 1), col = n0 + 8 * j + 2 * t + (c & 1);
          Y[i * LDV + col] -= accY[j][c];
        }
    }
    __syncthreads();
    PROF(5)
    // Phase 4b: V' = T Y.
    if (o_warp) {
      float acc[ON][4] = {};
#pragma unroll
      for (int k0 = 0; k0 < C; k0 += 8) {
        uint32_t af[4];
        mma_load_a(af, T + 16 * mi * LDC, LDC, 0, k0);
#pragma unroll
        for (int j = 0; j < ON; ++j) {
          uint32_t bf[2];
          mma_load_b_kn(bf, Y, LDV, k0, n0 + 8 * j);
          mma_tf32(acc[j], af, bf);
        }
      }
#pragma unroll
      for (int j = 0; j < ON; ++j)
#pragma unroll
        for (int c = 0; c < 4; ++c)
          Vp[(16 * mi + g + 8 * (c >> 1)) * LDV + n0 + 8 * j + 2 * t + (c & 1)] = acc[j][c];
    }
    __syncthreads();
    PROF(6)
    // Phase 4c: O += A V' (written as bf16); S <- exp(G_C) S + Kd^T V' (warp: rows 16 warp .. + 15 of S).
    if (o_warp) {
#pragma unroll
      for (int k0 = 0; k0 < C; k0 += 8) {
        uint32_t af[4];
        mma_load_a(af, A + 16 * mi * LDC, LDC, 0, k0);
#pragma unroll
        for (int j = 0; j < ON; ++j) {
          uint32_t bf[2];
          mma_load_b_kn(bf, Vp, LDV, k0, n0 + 8 * j);
          mma_tf32(accO[j], af, bf);
        }
      }
#pragma unroll
      for (int j = 0; j < ON; ++j)
#pragma unroll
        for (int hh = 0; hh < 2; ++hh) {
          const int i = 16 * mi + g + 8 * hh;
          if (i < n) {
            const int col = vh * VB + n0 + 8 * j + 2 * t;
            *reinterpret_cast<__nv_bfloat162*>(p.o + (size_t(t0 + i) * H + h) * 128 + col) =
                __floats2bfloat162_rn(accO[j][2 * hh], accO[j][2 * hh + 1]);
          }
        }
    }
    {
      constexpr int SN = 64 / NW;  // n-tiles of 8 per warp in S [128, 64]
      float acc[SN][4];
      const int d0 = 16 * (warp & 7), s0 = 8 * SN * (warp >> 3);
#pragma unroll
      for (int j = 0; j < SN; ++j)
#pragma unroll
        for (int c = 0; c < 4; ++c) {
          const int d = d0 + g + 8 * (c >> 1);
          acc[j][c] = decay[d] * S[d * LDV + s0 + 8 * j + 2 * t + (c & 1)];
        }
#pragma unroll
      for (int k0 = 0; k0 < C; k0 += 8) {
        uint32_t af[4];
        mma_load_a_t(af, Kd, LDK, d0, k0);
#pragma unroll
        for (int j = 0; j < SN; ++j) {
          uint32_t bf[2];
          mma_load_b_kn(bf, Vp, LDV, k0, s0 + 8 * j);
          mma_tf32(acc[j], af, bf);
        }
      }
#pragma unroll
      for (int j = 0; j < SN; ++j)
#pragma unroll
        for (int c = 0; c < 4; ++c)
          S[(d0 + g + 8 * (c >> 1)) * LDV + s0 + 8 * j + 2 * t + (c & 1)] = acc[j][c];
    }
    __syncthreads();
    PROF(7)
  }
  for (int e = tid; e < DK * VB; e += NT) {
    const int d = e >> 6, c = e & 63;
    Sg[size_t(d) * 128 + c] = S[d * LDV + c];
  }
}

Status launch(const KdaPrefillParams& p, GpuContext& g) {
  const size_t smem = size_t(SMEM_FLOATS) * sizeof(float);
  K3_CUDA_CHECK(
      cudaFuncSetAttribute(kda_prefill_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
  const dim3 grid(128 / VB, unsigned(p.n_head), unsigned(p.n_seq));
  kda_prefill_kernel<<<grid, NT, smem, g.stream>>>(p);
  K3_CUDA_CHECK(cudaGetLastError());
  return ok_status();
}

}  // namespace

#ifdef KDA_FAST_PROFILE
void kda_fast_profile_read(unsigned long long* out8, bool reset) {
  cudaMemcpyFromSymbol(out8, kda_prof, 8 * sizeof(unsigned long long));
  if (reset) {
    const unsigned long long zero[8] = {};
    cudaMemcpyToSymbol(kda_prof, zero, sizeof zero);
  }
}
#endif

Status kda_prefill_fast_cuda_onekernel(const KdaPrefillParams& p, GpuContext& g) {
  Status st = kda_prefill_fast_check(p);
  if (!st.ok()) return st;
  if (p.n_tok == 0) return ok_status();
  return launch(p, g);
}

}  // namespace k3
