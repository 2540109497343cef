// kda_fast_prefill_intra.cu: the state-independent half of the two-kernel chunkwise KDA prefill (kda_fast.h;
// the default; checked and timed on the H200 in session 4), one CTA
// (8 warps) per (chunk, head), all chunks in parallel. Writes the chunk's scratch (layout in
// kda_fast_prefill.cuh): Qe, -W, Kd^T, A, T as fp16 MMA fragments, exp(G_C).
//   G = cumsum g (in-chunk);  A[i,j] = q_i.k_j exp(G_i - G_j) (j <= i);
//   L[i,j] = beta_i k_i.k_j exp(G_i - G_j) (j < i), one 16-row block a at a time against reference
//   R_a = G_{16a}: rows x_i exp(G_i - R_a) in [e^-75, 1] (K3's gate bound g >= -5), columns
//   k_j exp(R_a - G_j) <= e^75 in block a and <= 1 before it (an underflow there is a product below e^-87);
//   T = (I + L)^-1 by 16x16 blocks;
//   W = T (beta exp(G) k),  Qe = exp(G) q,  Kd = exp(G_C - G) k.
// All products: mma.sync m16n8k8 tf32, fp32 accumulate.
//
// Two versions of the same arithmetic, picked at compile time by KDA_PRE_INTRA_V; they write the same
// scratch bit for bit (same expressions, same fp32 operation order, same MMA k order; only where values live
// and which thread computes them differ; KDA_PRE_EXP_FTZ=1 is the exception, see exp_g):
//   2 (default since session 7): 72 KB of shared memory, 80 registers, no local memory: 3 CTAs (24 warps)
//   per SM. On the H200 (session 7) it wrote the same outputs as version 1 (every fp64 check equal to the
//   printed digits) and took the pre-pass at T = 8192 from 2.451 to 1.361 ms (the prefill 3.473 -> 2.359 ms).
//     G [64 x 128] is not kept: the first pass stores G every 8 rows, and the A/L blocks (which also write
//     Qe and Kd^T) and the Bk pass redo the cumsum from those carries (the same additions in the same
//     order, so the same G). Qr, Kr (pre-rounded to tf32) and Kc sit in MMA fragment order, one 16-byte
//     load per fragment pair; Bk is stored rounded; the blocked inverse reads its row operands 4 at a time.
//   1 (default until version 2 is checked and timed on the H200): session 4's, 106 KB of shared memory and
//     128 registers, 2 CTAs per SM. Bench: KDA_FLAGS=-DKDA_PRE_INTRA_V=2 bench/kda_cuda/build.sh.
#include <cuda_bf16.h>

#include "ops/kda_fast_prefill.cuh"

#ifndef KDA_PRE_INTRA_V
#define KDA_PRE_INTRA_V 2
#endif
#ifndef KDA_PRE_EXP_FTZ    // 1 since session 18 (H100: every fp64 check equal to the printed digits, pre-pass
#define KDA_PRE_EXP_FTZ 1  // T = 8192 1.413 -> 1.358 ms); 0: __expf
#endif

namespace k3::kdapre {
namespace {

constexpr int NT = 256, NW = NT / 32;
constexpr int LDB = 136;  // B operands given [k][n]
constexpr int LDC = 68;   // 64 x 64 matrices L, T

// s + sum_x row[x] col[x ld], x = 0..15 in order; VEC reads row 4 at a time (the same products, same order)
template <bool VEC>
__device__ __forceinline__ float dot16(const float* row, const float* col, int ld, float s) {
  if constexpr (VEC) {
#pragma unroll
    for (int x = 0; x < 16; x += 4) {
      const float4 r4 = *reinterpret_cast<const float4*>(row + x);
      s += r4.x * col[x * ld];
      s += r4.y * col[(x + 1) * ld];
      s += r4.z * col[(x + 2) * ld];
      s += r4.w * col[(x + 3) * ld];
    }
  } else {
#pragma unroll
    for (int x = 0; x < 16; ++x) s += row[x] * col[x * ld];
  }
  return s;
}

// T = (I + L)^-1 (unit lower triangular), 16x16 blocks: T_aa by substitution (threads 0-63, one column
// each; invert_diag in kda_fast_prefill.cuh), then T_ab = -T_aa sum_{c=b}^{a-1} L_ac T_cb by distance
// a - b (invert_off, all threads, after a barrier). Blocks above the diagonal are never read.
// P_b (16 x 16, row stride LDP) = P0 + b * P_STEP, b = 0..2: the products sum_c L_ac T_cb of one level.
// VEC reads the row operands (L_ac, T_aa) 4 at a time; the products and their order are the same.
template <int LDP, int P_STEP, bool VEC>
__device__ void invert_off(const float* L, float* T, float* P0) {
  const int tid = threadIdx.x;
  const int r = tid >> 4, c = tid & 15;  // one thread per element of a 16x16 block
  for (int dist = 1; dist < 4; ++dist) {
    for (int b = 0; b + dist < 4; ++b) {
      const int a = b + dist;
      float s = 0.f;
      for (int cc = b; cc < a; ++cc) {
        s = dot16<VEC>(L + (16 * a + r) * LDC + 16 * cc, T + 16 * cc * LDC + 16 * b + c, LDC, s);
      }
      P0[b * P_STEP + r * LDP + c] = s;
    }
    __syncthreads();
    for (int b = 0; b + dist < 4; ++b) {
      const int a = b + dist;
      T[(16 * a + r) * LDC + 16 * b + c] = -dot16<VEC>(T + (16 * a + r) * LDC + 16 * a, P0 + b * P_STEP + c, LDP, 0.f);
    }
    __syncthreads();
  }
}

// The end of both versions, T complete in shared memory: T's fragments, then -W = -T Bk. Bk is fp32 (rounded
// to tf32 here) or, with BK_TF32, words already rounded.
template <bool BK_TF32>
__device__ __forceinline__ void write_t_w(const float* T, const float* Bk, uint32_t* scr) {
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  // T fragments (lower triangular: pairs p <= mt).
  for (int f = tid; f < 512; f += NT) {
    const int fl = f & 31, m = f >> 7, pp = (f >> 5) & 3;
    if (pp > m) continue;
    const int i = 16 * m + (fl >> 2), j = 16 * pp + (fl & 3);
    auto tv = [&](int ii, int jj) { return T[ii * LDC + jj]; };
    reinterpret_cast<uint4*>(scr + OFF_TF)[f] =
        make_uint4(pack_h2(tv(i, j), tv(i + 8, j)), pack_h2(tv(i, j + 4), tv(i + 8, j + 4)),
                   pack_h2(tv(i, j + 8), tv(i + 8, j + 8)), pack_h2(tv(i, j + 12), tv(i + 8, j + 12)));
  }
  // W = T Bk: warp rows 16 mt.., n-tiles 8 nh .. 8 nh + 7; T is lower triangular (k < 16 mt + 16).
  const int mt = warp & 3, nh = warp >> 2, n_ks = 2 * (mt + 1);
  uint32_t ta[8][4];
#pragma unroll
  for (int ks = 0; ks < 8; ++ks)
    if (ks < n_ks) lds_a(ta[ks], T, LDC, 16 * mt, 8 * ks);
#pragma unroll 4
  for (int j = 0; j < 8; ++j) {
    const int nt = 8 * nh + j;
    float acc[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
    for (int ks = 0; ks < 8; ++ks) {
      if (ks < n_ks) {
        uint32_t bw[2];
        if constexpr (BK_TF32) {
          lds_b_kn_u(bw, reinterpret_cast<const uint32_t*>(Bk), LDB, 8 * ks, 8 * nt);
        } else {
          lds_b_kn(bw, Bk, LDB, 8 * ks, 8 * nt);
        }
        mma_tf32(acc, ta[ks], bw);
      }
    }
#pragma unroll
    for (int c = 0; c < 4; ++c) acc[c] = -acc[c];
    reinterpret_cast<uint2*>(scr + OFF_WN)[2 * frag_at(mt, nt >> 1, 8, lane) + (nt & 1)] = c_to_a_h(acc);
  }
}

// One 8-column tile of block row a from its two MMA halves: L's (strictly below the diagonal, times beta) to
// L, A's (on and below the diagonal) to the scratch as fp16 A fragments. Both versions' al_tiles end here.
__device__ __forceinline__ void al_tile_out(float (&acc)[4], const float (&acc2)[4], int a, int j0, bool is_l,
                                            const float* beta, float* L, uint32_t* scr) {
  const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
#pragma unroll
  for (int c = 0; c < 4; ++c) {
    const int i = 16 * a + g + 8 * (c >> 1), j = j0 + 2 * t + (c & 1);
    const float x = acc[c] + acc2[c];
    acc[c] = is_l ? (j < i ? beta[i] * x : 0.f) : (j <= i ? x : 0.f);
    if (is_l) L[i * LDC + j] = acc[c];
  }
  if (!is_l)
    reinterpret_cast<uint2*>(scr + OFF_AF)[2 * frag_at(a, j0 / 16, 4, lane) + (j0 / 8 & 1)] = c_to_a_h(acc);
}

#if KDA_PRE_INTRA_V == 1
// ---- Version 1 (session 4): G, Kc, L, T, Bk all in shared memory, 106 KB, 2 CTAs per SM. ----
namespace v1 {

constexpr int LDR = 132;  // rows read as A operands, or as B given [n][k]

__device__ __forceinline__ float ld_bf16(const uint16_t* x, size_t i) {
  return __uint_as_float(uint32_t(__ldg(x + i)) << 16);
}

struct Chunk {
  const KdaPrefillParams* p;
  int64_t t0;
  int n, h;
  __device__ size_t at(int i, int d) const { return (size_t(t0 + i) * p->n_head + h) * DK + d; }
  __device__ float q(int i, int d) const { return i < n ? ld_bf16(p->q, at(i, d)) : 0.f; }
  __device__ float k(int i, int d) const { return i < n ? ld_bf16(p->k, at(i, d)) : 0.f; }
  __device__ float g(int i, int d) const { return i < n ? ld_bf16(p->g, at(i, d)) : 0.f; }
};

// This chunk's q and k rows (64 x 256 B each, strided by the heads) into L2 for the A, L rounds.
__device__ __forceinline__ void prefetch_qk(const Chunk& ch) {
  const int tid = threadIdx.x, i = (tid >> 1) & 63, half = tid & 1;
  const uint16_t* base = (tid < 128 ? ch.p->q : ch.p->k) + ch.at(i < ch.n ? i : 0, 64 * half);
  asm volatile("prefetch.global.L2 [%0];" ::"l"(base));
}

// The MMAs of row block a, once Qr, Kr (the block's rows against R_a) and Kc (columns j < 16 (a + 1)) are in
// shared memory: A's 8-column tiles to the scratch, L's (times beta) to L.
template <int a>
__device__ __forceinline__ void al_tiles(const float* Qr, const float* Kr, const float* Kc, float* L,
                                         const float* beta, uint32_t* scr) {
  const int warp = threadIdx.x >> 5;
  constexpr int n_tile = 2 * (a + 1);  // 8-column tiles of block row a: A's, then L's
  for (int tile = warp; tile < 2 * n_tile; tile += NW) {
    const bool is_l = tile >= n_tile;
    const int j0 = 8 * (tile % n_tile);
    const float* X = is_l ? Kr : Qr;
    float acc[4] = {0.f, 0.f, 0.f, 0.f}, acc2[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
    for (int k0 = 0; k0 < DK; k0 += 16) {
      uint32_t af[4], bf[2], af2[4], bf2[2];
      lds_a(af, X, LDR, 0, k0);
      lds_b_nk(bf, Kc, LDR, k0, j0);
      lds_a(af2, X, LDR, 0, k0 + 8);
      lds_b_nk(bf2, Kc, LDR, k0 + 8, j0);
      mma_tf32(acc, af, bf);
      mma_tf32(acc2, af2, bf2);
    }
    al_tile_out(acc, acc2, a, j0, is_l, beta, L, scr);
  }
}

// Shared memory in floats; regions reused across phases.
constexpr int R0 = 0;             // G [64][LDR]
constexpr int R1 = R0 + C * LDB;  // Kc [64][LDR] (A, L) -> Bk = beta exp(G) k [64][LDB]
constexpr int R2 = R1 + C * LDB;  // L [64][LDC]
constexpr int R3 = R2 + C * LDC;  // Qr, Kr [16][LDR] each (A, L) -> T [64][LDC]
constexpr int RB = R3 + C * LDC;  // beta [64]
constexpr int RG = RB + C;        // G_C [128]
constexpr int RP = RG + DK;       // [3][16][16] scratch of the blocked inverse
constexpr int SMEM_FLOATS = RP + 3 * 256;
static_assert(2 * 16 * LDR <= C * LDC, "Qr, Kr fit the T region");

// A and L for row block a. Each thread keeps one channel d; the earlier columns move from reference
// R_{a-1} to R_a by one factor exp(R_a - R_{a-1}) <= 1.
template <int a>
__device__ __forceinline__ void block_al(float* sm, const Chunk& ch, uint32_t* scr) {
  const int tid = threadIdx.x, d = tid & 127, r0 = tid >> 7;
  const float* G = sm + R0;
  float *Kc = sm + R1, *Qr = sm + R3, *Kr = Qr + 16 * LDR;
  const float Rd = G[16 * a * LDR + d];
#pragma unroll
  for (int r = r0; r < 16; r += 2) {
    const int i = 16 * a + r;
    const float f = __expf(G[i * LDR + d] - Rd);
    Qr[r * LDR + d] = ch.q(i, d) * f;
    Kr[r * LDR + d] = ch.k(i, d) * f;
  }
  if constexpr (a > 0) {
    const float f = __expf(Rd - G[16 * (a - 1) * LDR + d]);
#pragma unroll
    for (int j = r0; j < 16 * a; j += 2) Kc[j * LDR + d] *= f;
  }
#pragma unroll
  for (int j = 16 * a + r0; j < 16 * (a + 1); j += 2)
    Kc[j * LDR + d] = ch.k(j, d) * __expf(Rd - G[j * LDR + d]);
  __syncthreads();
  al_tiles<a>(Qr, Kr, Kc, sm + R2, sm + RB, scr);
  __syncthreads();
}

__global__ void __launch_bounds__(NT, 2)
    kda_intra_kernel(const KdaPrefillParams p, uint32_t* ws, int64_t c0) {
  extern __shared__ float4 smem_f4[];
  float* sm = reinterpret_cast<float*>(smem_f4);
  const int tid = threadIdx.x;
  const int h = blockIdx.y, H = p.n_head;
  ChunkPos pos;
  if (!chunk_pos(p, c0 + blockIdx.x, pos)) return;
  const Chunk ch{&p, pos.t0, pos.n, h};
  uint32_t* scr = ws + (size_t(blockIdx.x) * H + h) * CHUNK_WORDS;
  prefetch_qk(ch);
  float *G = sm + R0, *beta = sm + RB, *GC = sm + RG;
  // G = cumsum g: thread d < 128 walks column d.
  if (tid < C) beta[tid] = tid < ch.n ? __ldg(p.beta + size_t(ch.t0 + tid) * H + h) : 0.f;
  if (tid < DK) {
    float x[C], acc = 0.f;
#pragma unroll
    for (int i = 0; i < C; ++i) x[i] = ch.g(i, tid);
#pragma unroll
    for (int i = 0; i < C; ++i) {
      acc += x[i];
      G[i * LDR + tid] = acc;
    }
    GC[tid] = acc;
    scr[OFF_DC + tid] = __float_as_uint(__expf(acc));
  }
  __syncthreads();
  block_al<0>(sm, ch, scr);
  block_al<1>(sm, ch, scr);
  block_al<2>(sm, ch, scr);
  block_al<3>(sm, ch, scr);
  // Threads 0-63: the diagonal inverses. The others meanwhile: Qe and Kd^T fragments straight to the
  // scratch, Bk = beta exp(G) k into R1 (Kc is dead).
  if (tid < 64) {
    invert_diag<LDC>(sm + R2, sm + R3);
  } else {
    constexpr int NE = NT - 64;
    const int te = tid - 64;
    uint4* qe = reinterpret_cast<uint4*>(scr + OFF_QE);
    uint4* kt = reinterpret_cast<uint4*>(scr + OFF_KT);
    for (int f = te; f < 1024; f += NE) {
      const int fl = f & 31, fg = fl >> 2, ft = fl & 3;
      {  // QE: mt = f / 256, k-steps 2p, 2p + 1 with p = (f / 32) % 8
        const int i = 16 * (f >> 8) + fg, d = 16 * ((f >> 5) & 7) + ft;
        auto qv = [&](int ii, int dd) { return __expf(G[ii * LDR + dd]) * ch.q(ii, dd); };
        qe[f] =
            make_uint4(pack_h2(qv(i, d), qv(i + 8, d)), pack_h2(qv(i, d + 4), qv(i + 8, d + 4)),
                       pack_h2(qv(i, d + 8), qv(i + 8, d + 8)), pack_h2(qv(i, d + 12), qv(i + 8, d + 12)));
      }
      {  // KT: mt = f / 128 over channels d, k-steps 2p, 2p + 1 over tokens i, p = (f / 32) % 4
        const int d = 16 * (f >> 7) + fg, i = 16 * ((f >> 5) & 3) + ft;
        auto kd = [&](int ii, int dd) { return __expf(GC[dd] - G[ii * LDR + dd]) * ch.k(ii, dd); };
        kt[f] =
            make_uint4(pack_h2(kd(i, d), kd(i, d + 8)), pack_h2(kd(i + 4, d), kd(i + 4, d + 8)),
                       pack_h2(kd(i + 8, d), kd(i + 8, d + 8)), pack_h2(kd(i + 12, d), kd(i + 12, d + 8)));
      }
    }
    float* Bk = sm + R1;
    for (int e = te; e < C * DK; e += NE) {
      const int i = e >> 7, d = e & 127;
      Bk[i * LDB + d] = beta[i] * __expf(G[i * LDR + d]) * ch.k(i, d);
    }
  }
  __syncthreads();
  invert_off<16, 256, false>(sm + R2, sm + R3, sm + RP);  // ends with a barrier: T ready
  write_t_w<false>(sm + R3, sm + R1, scr);
}

}  // namespace v1
namespace ver = v1;
#else

// ---- Version 2: 72 KB, <= 80 registers, 3 CTAs per SM. ----
namespace v2 {

// Shared memory in floats, by phase: P0 the G walk; P1 the A/L blocks (and the Qe, Kd^T fragments); P2 the
// diagonal inverses (threads 0-63) beside the Bk pass (64-255); P3 the off-diagonal inverse; P4 T's
// fragments and W. 73,984 bytes: 3 CTAs per SM (3 x (72.25 + 1 reserved) KB <= 228 KB).
constexpr int KC = 0;             // Kc, B-fragment order (P1) -> Bk = tf32(beta exp(G) k) [64][LDB] (P2-P4)
constexpr int QT = KC + C * LDB;  // Qr, Kr, A-fragment order, tf32 (P1) -> T [64][LDC] (P2-P4)
constexpr int LL = QT + C * LDC;  // L [64][LDC] (P1-P3); P3's products P_b in its unused blocks (b, b+1)
constexpr int BE = LL + C * LDC;  // beta [64] (P0-P2)
constexpr int GK = BE + C;        // G at rows 8m + 7, m = 0..7 [8][128] (P0 -> P1, P2); row 7 = G_C
constexpr int SMEM_FLOATS = GK + 8 * DK;
static_assert(2 * 16 * DK <= C * LDC, "Qr, Kr fit the T region");
static_assert(3 * (SMEM_FLOATS * 4 + 1024) <= 228 * 1024, "3 CTAs per SM (1 KB reserved per CTA)");
// Fragment orders (one 16-byte load per lane and k-step pair; lane = 4 g + t):
//   Qr, Kr: word (s * 32 + lane) * 4 + w holds (row g + 8 (w & 1), channel 8 s + t + 4 (w >> 1)): lane's A
//     fragment {a0, a1, a2, a3} of k-step s;
//   Kc: word ((jt * 8 + m) * 32 + lane) * 4 + w holds (column 8 jt + g, channel 16 m + t + 4 w): lane's B
//     fragments {b0, b1} of k-steps 2m and 2m + 1 for n-tile jt.
__device__ __forceinline__ int qr_base(int d) {
  return (d >> 3) * 128 + 4 * (d & 3) + 2 * ((d >> 2) & 1);
}
__device__ __forceinline__ int kc_base(int d) {
  return (d >> 4) * 128 + 4 * (d & 3) + ((d >> 2) & 3);
}

// __expf (ex2.approx of x log2 e, results below 2^-126 kept by a scaling step), or with KDA_PRE_EXP_FTZ=1 the
// flush-to-zero ex2 (2 instructions instead of 5): equal wherever the result is >= 2^-126. Within the gate
// contract (g >= -5) the factors of A and L stay above e^-80; only exp(G) and exp(G_C - G) can fall below,
// and their products are stored as fp16 (0 either way) or feed W, stored as fp16, at ~1e-38.
// KDA_PRE_LOG2=1 (with the flush-to-zero ex2): G is kept in log2 units (g scaled by log2 e as it is summed,
// one FFMA instead of one FADD), so each exponential is one ex2 without the scaling multiply.
#ifndef KDA_PRE_LOG2
#define KDA_PRE_LOG2 0
#endif
static_assert(!KDA_PRE_LOG2 || KDA_PRE_EXP_FTZ, "KDA_PRE_LOG2 needs KDA_PRE_EXP_FTZ");
constexpr float kGScale = KDA_PRE_LOG2 ? 1.4426950408889634f : 1.f;  // G's unit: log2 (e) or ln
__device__ __forceinline__ float exp_g(float x) {
#if KDA_PRE_EXP_FTZ
  float r;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(KDA_PRE_LOG2 ? x : x * 1.4426950408889634f));
  return r;
#else
  return __expf(x);
#endif
}

// bf16 x[0] as fp32, 0 for a padding row.
__device__ __forceinline__ float ld_row(const uint16_t* x, bool in) {
  return in ? __uint_as_float(uint32_t(__ldg(x)) << 16) : 0.f;
}
// The chunk's q, k, g rows: pointers at (t0, h), element (i, d) at i * rs + d (passes over rows step the
// pointers by rs: fewer address instructions than a product per load).
struct Rows {
  const uint16_t *q, *k, *g;
  int rs, n;  // row stride n_head * 128, valid rows
};

// The MMAs of row block a from the fragment-ordered Qr, Kr, Kc; the same products in the same order as
// al_tiles.
template <int a>
__device__ __forceinline__ void al_tiles(const uint32_t* Qf, const uint32_t* Kf, const float* Kc, float* L,
                                         const float* beta, uint32_t* scr) {
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  constexpr int n_tile = 2 * (a + 1);  // 8-column tiles of block row a: A's, then L's
  for (int tile = warp; tile < 2 * n_tile; tile += NW) {
    const bool is_l = tile >= n_tile;
    const int jt = tile % n_tile, j0 = 8 * jt;
    const uint4* X = reinterpret_cast<const uint4*>(is_l ? Kf : Qf) + lane;
    const float4* B = reinterpret_cast<const float4*>(Kc) + jt * 256 + lane;
    float acc[4] = {0.f, 0.f, 0.f, 0.f}, acc2[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
    for (int m = 0; m < 8; ++m) {
      const uint4 x0 = X[64 * m], x1 = X[64 * m + 32];
      const float4 b = B[32 * m];
      const uint32_t af[4] = {x0.x, x0.y, x0.z, x0.w}, af2[4] = {x1.x, x1.y, x1.z, x1.w};
      const uint32_t bf[2] = {to_tf32(b.x), to_tf32(b.y)}, bf2[2] = {to_tf32(b.z), to_tf32(b.w)};
      mma_tf32(acc, af, bf);
      mma_tf32(acc2, af2, bf2);
    }
    al_tile_out(acc, acc2, a, j0, is_l, beta, L, scr);
  }
}

// A and L for row block a, and the block's Qe and Kd^T fragments. Thread (d, hr) redoes the cumsum of rows
// i = 16a + 8hr .. +7 of channel d from the carry G_{16a+8hr-1}; the earlier columns of Kc move from R_{a-1}
// (Rprev) to R_a by exp(R_a - R_{a-1}). Qe's fp16 pairs are rows (i, i + 8), threads tid and tid + 128:
// each writes its half. Kd^T's pairs are channels (d, d + 8) of one token, lanes d and d + 8 of one warp:
// they swap two rows at a time, lane d writes the even row's pair, lane d + 8 the odd row's.
// Element maps: QE word ((mt * 8 + p) * 32 + 4 g + t) * 4 + w holds (row 16 mt + g + 8 half, channel
// 16 p + 4 w + t); KT word ((mt * 4 + p) * 32 + 4 g + t) * 4 + w holds (channel 16 mt + g + 8 half, token
// 16 p + 4 w + t).
template <int a>
__device__ __forceinline__ void block_al(float* sm, const Rows& x, uint32_t* scr, float& Rprev) {
  const int tid = threadIdx.x, d = tid & 127, hr = tid >> 7, hi = (d >> 3) & 1;
  const float* Gk = sm + GK;
  float* Kc = sm + KC + kc_base(d);
  uint32_t* Qf = reinterpret_cast<uint32_t*>(sm + QT);
  uint32_t* Kf = Qf + 16 * DK;
  const int i0 = 16 * a + 8 * hr, qo = qr_base(d) + hr;
  const int o0 = i0 * x.rs + d;
  float Gr[8];
  {
    float acc = i0 == 0 ? 0.f : Gk[(i0 / 8 - 1) * DK + d];
    const uint16_t* gp = x.g + o0;
#pragma unroll
    for (int r = 0; r < 8; ++r, gp += x.rs) {
      acc += ld_row(gp, i0 + r < x.n) * kGScale;
      Gr[r] = acc;
    }
  }
  float Rd = Gr[0];  // G_{16a}
  if (hr) {
    Rd = a == 0 ? 0.f : Gk[(2 * a - 1) * DK + d];
    Rd += ld_row(x.g + 16 * a * x.rs + d, 16 * a < x.n) * kGScale;
  }
  const float gc = Gk[7 * DK + d];
  uint16_t* qe = reinterpret_cast<uint16_t*>(scr + OFF_QE) +
                 (2 * (((a * 8 + (d >> 4)) * 32 + (d & 3)) * 4 + ((d >> 2) & 3)) + hr);
  uint32_t* kt = scr + OFF_KT + (((d >> 4) * 4 + a) * 32 + 4 * (d & 7) + hi) * 4 + 2 * hr;
  float kd_even = 0.f;
  const uint16_t *kp = x.k + o0, *qp = x.q + o0;
#pragma unroll
  for (int r = 0; r < 8; ++r, kp += x.rs, qp += x.rs) {
    const bool in = i0 + r < x.n;
    const float kv = ld_row(kp, in), qv = ld_row(qp, in), f = exp_g(Gr[r] - Rd);
    Qf[qo + 16 * r] = to_tf32(qv * f);
    Kf[qo + 16 * r] = to_tf32(kv * f);
    Kc[(2 * a + hr) * 1024 + 16 * r] = kv * exp_g(Rd - Gr[r]);
    qe[32 * r] = __half_as_ushort(__float2half_rn(exp_g(Gr[r]) * qv));
    const float kd = exp_g(gc - Gr[r]) * kv;
    if (r & 1) {
      const float recv = __shfl_xor_sync(0xffffffffu, hi ? kd_even : kd, 8);
      kt[4 * ((r - 1) & 3) + ((r - 1) >> 2)] = hi ? pack_h2(recv, kd) : pack_h2(kd_even, recv);
    } else {
      kd_even = kd;
    }
  }
  if constexpr (a > 0) {  // rows 8 (2 mm + hr) + jj of the earlier blocks
    const float f = exp_g(Rd - Rprev);
#pragma unroll
    for (int mm = 0; mm < a; ++mm)
#pragma unroll
      for (int jj = 0; jj < 8; ++jj) Kc[(2 * mm + hr) * 1024 + 16 * jj] *= f;
  }
  Rprev = Rd;
  __syncthreads();
  al_tiles<a>(Qf, Kf, sm + KC, sm + LL, sm + BE, scr);
  __syncthreads();
}

// Rows 16a .. 16a + 15 of Bk = tf32(beta exp(G) k), channel d, into KC, by the cumsum from the carry
// G_{16a-1}.
__device__ __forceinline__ void bk_block(float* sm, const Rows& x, int a, int d) {
  const float *Gk = sm + GK, *beta = sm + BE;
  uint32_t* Bk = reinterpret_cast<uint32_t*>(sm + KC);
  float acc = a == 0 ? 0.f : Gk[(2 * a - 1) * DK + d];
  const int o = 16 * a * x.rs + d;
  const uint16_t *gp = x.g + o, *kp = x.k + o;
#pragma unroll
  for (int r = 0; r < 16; ++r, gp += x.rs, kp += x.rs) {
    const int i = 16 * a + r;
    const bool in = i < x.n;
    acc += ld_row(gp, in) * kGScale;
    const float kv = ld_row(kp, in);
    Bk[i * LDB + d] = to_tf32(beta[i] * exp_g(acc) * kv);
  }
}

__global__ void __launch_bounds__(NT, 3)
    kda_intra_kernel(const KdaPrefillParams p, uint32_t* ws, int64_t c0) {
  extern __shared__ float4 smem_f4[];
  float* sm = reinterpret_cast<float*>(smem_f4);
  const int tid = threadIdx.x;
  const int h = blockIdx.y, H = p.n_head;
  ChunkPos pos;
  if (!chunk_pos(p, c0 + blockIdx.x, pos)) return;
  const size_t base = (size_t(pos.t0) * H + h) * DK;
  const Rows x{p.q + base, p.k + base, p.g + base, H * DK, pos.n};
  uint32_t* scr = ws + (size_t(blockIdx.x) * H + h) * CHUNK_WORDS;
  {  // this chunk's q and k rows (64 x 256 B each, strided by the heads) into L2 for the A, L rounds
    const int i = (tid >> 1) & 63;
    const uint16_t* row = (tid < 128 ? x.q : x.k) + (i < x.n ? i : 0) * x.rs + 64 * (tid & 1);
    asm volatile("prefetch.global.L2 [%0];" ::"l"(row));
  }
  // P0: thread d < 128 walks column d of G = cumsum g, keeping every 8th row; threads 128-191 load beta.
  if (tid < DK) {
    float* Gk = sm + GK;
    float acc = 0.f;
    const uint16_t* gp = x.g + tid;
#pragma unroll 1
    for (int m0 = 0; m0 < 8; m0 += 4) {
      float xg[32];  // 32 rows of loads in flight
#pragma unroll
      for (int r = 0; r < 32; ++r, gp += x.rs) xg[r] = ld_row(gp, 8 * m0 + r < x.n) * kGScale;
#pragma unroll
      for (int m = 0; m < 4; ++m) {
#pragma unroll
        for (int r = 0; r < 8; ++r) acc += xg[8 * m + r];
        Gk[(m0 + m) * DK + tid] = acc;
      }
    }
    scr[OFF_DC + tid] = __float_as_uint(KDA_PRE_LOG2 ? exp_g(acc) : __expf(acc));
  } else if (tid < DK + C) {
    const int i = tid - DK;
    sm[BE + i] = i < x.n ? __ldg(p.beta + size_t(pos.t0 + i) * H + h) : 0.f;
  }
  __syncthreads();
  float Rprev = 0.f;
  block_al<0>(sm, x, scr, Rprev);
  block_al<1>(sm, x, scr, Rprev);
  block_al<2>(sm, x, scr, Rprev);
  block_al<3>(sm, x, scr, Rprev);
  // P2: threads 0-63 the diagonal inverses; the others Bk (Kc is dead), (block, channel) units u = 128 a + d.
  if (tid < 64) {
    invert_diag<LDC>(sm + LL, sm + QT);
  } else {
    for (int u = tid - 64; u < 4 * DK; u += NT - 64) bk_block(sm, x, u >> 7, u & 127);
  }
  __syncthreads();
  invert_off<LDC, 16 * LDC + 16, true>(sm + LL, sm + QT, sm + LL + 16);  // ends with a barrier: T ready
  write_t_w<true>(sm + QT, sm + KC, scr);
}

}  // namespace v2
namespace ver = v2;
#endif

}  // namespace

size_t intra_smem_bytes() {
  return size_t(ver::SMEM_FLOATS) * sizeof(float);
}

cudaError_t launch_intra(const KdaPrefillParams& p, uint32_t* ws, int64_t c0, int n_chunk, cudaStream_t st) {
  const size_t smem = intra_smem_bytes();
  cudaError_t e =
      cudaFuncSetAttribute(ver::kda_intra_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem));
  if (e == cudaSuccess)  // all of the SM's 228 KB to shared memory: 3 CTAs of version 2
    e = cudaFuncSetAttribute(ver::kda_intra_kernel, cudaFuncAttributePreferredSharedMemoryCarveout,
                             int(cudaSharedmemCarveoutMaxShared));
  if (e != cudaSuccess) return e;
  ver::kda_intra_kernel<<<dim3(unsigned(n_chunk), unsigned(p.n_head)), NT, smem, st>>>(p, ws, c0);
  return cudaGetLastError();
}

}  // namespace k3::kdapre
