// kda_fast_decode.cu: one fused KDA decode step per layer for d_k = d_v = 128 (kda_fast.h).
//
// One CTA (8 warps) per (head, sequence). The state S[slot][h] [128, 128] fp32 is read once into registers
// (warp w holds rows 16w .. 16w+15, lane l columns 4l .. 4l+3, issued before anything else so the loads
// overlap the conv), updated and written back once, in place:
//   conv window + current pre-conv input -> SiLU -> bf16;  q, k l2norm (q * K^-1/2);  alpha = exp(g),
//   g = g_lower sigmoid(exp(A_log) (f + dt_bias));  beta = sigmoid(b)
//   S <- diag(alpha) S;  u = beta (v - S^T k);  S <- S + k u^T;  o = bf16(S^T q)
//   out = o rsqrt(mean(o^2) + eps) w_onorm sigmoid(gate)
// Sums over the 128 rows go through shared memory, one partial per warp.
//
// This kernel serves small batches (fewer than 8 sequences; validated on the H200 in session 2). The
// bulk-copy (TMA) version in kda_fast_decode_tma.cu serves larger batches and the optional fields of
// KdaDecodeParams (per-sequence state pointers, separate conv taps, KL's gate, traced intermediates).
#include <cooperative_groups.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdlib>
#include <string>

#include "core/cuda_check.h"
#include "core/env.h"
#include "ops/kda_fast.h"

namespace k3 {
namespace {

#ifndef KDA_DECODE_SPLIT
#define KDA_DECODE_SPLIT 0
#endif
#ifndef KDA_DECODE_MIN_BLOCKS  // CTAs per SM the register budget is sized for (2: no spills)
#define KDA_DECODE_MIN_BLOCKS 2
#endif
#ifndef KDA_DECODE_NT  // threads per CTA of the one-CTA version (256 or 512)
#define KDA_DECODE_NT 256
#endif
// Timing probes for the bench only (the output is wrong with any of them): 1 leaves out the state's store,
// 2 its load (the state is a constant), 3 both. They place the b = 1 step's time (H200.md: time variants
// that leave one stage out).
#ifndef KDA_DECODE_PROBE
#define KDA_DECODE_PROBE 0
#endif
// 1: the one-CTA kernel loads the conv window before the state instead of after it (bench variant).
#ifndef KDA_DECODE_WIN_FIRST
#define KDA_DECODE_WIN_FIRST 0
#endif
constexpr int DK = 128, DV = 128, NT = KDA_DECODE_SPLIT ? 256 : KDA_DECODE_NT, NW = NT / 32;
static_assert(NT == 256 || NT == 512, "the one-CTA decode kernel is written for 8 or 16 warps");
[[maybe_unused]] constexpr int ROWS = DK / NW;  // rows per warp (one-CTA version)

__device__ inline float bf16f(uint16_t x) {
  return __uint_as_float(uint32_t(x) << 16);
}
__device__ inline float round_bf16(float x) {
  return __bfloat162float(__float2bfloat16_rn(x));
}
__device__ inline float warp_sum(float x) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) x += __shfl_xor_sync(0xffffffffu, x, o);
  return x;
}

#if !KDA_DECODE_SPLIT
__global__ void __launch_bounds__(NT, KDA_DECODE_MIN_BLOCKS) kda_decode_kernel(const KdaDecodeParams p) {
  __shared__ __align__(16) float x[3][DK];  // conv outputs q~, k~, v~ (bf16 values), then q, k normalized
  __shared__ float alpha[DK];               // exp(g)
  __shared__ __align__(16) float red[2][NW][DV];  // per-warp partial sums: S^T k, then S^T q
  __shared__ float scal[4];                       // |q|^-1, |k|^-1, beta, rms
  const int h = blockIdx.x, b = blockIdx.y, tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int H = p.n_head, HK = H * DK;
  // Every input is loaded up front, before the first store (the window roll) and before the slot is known, so
  // the loads overlap in one round of memory latency instead of one round per phase (session 5: at b = 1 the
  // step is latency-bound, DRAM at 17% of peak). Conv items: e = tid and tid + NT (e < 3 * DK),
  // e = m * DK + c.
  constexpr int NE = (3 * DK + NT - 1) / NT;
  float4 cw[NE];
  uint16_t cur[NE];
#pragma unroll
  for (int r = 0; r < NE; ++r) {
    const int e = tid + NT * r, m = e / DK, ch = h * DK + e % DK;
    if (e < 3 * DK) {
      cw[r] = reinterpret_cast<const float4*>(p.conv_w)[size_t(m) * HK + ch];
      cur[r] = p.qkv[(size_t(b) * 3 + m) * HK + ch];
    }
  }
  float A = 0.f, z = 0.f, gt = 0.f, onw = 0.f, blog = 0.f;
  if (tid < DK) {
    A = __expf(p.A_log[h]);
    z = bf16f(p.f[size_t(b) * HK + h * DK + tid]) + p.dt_bias[h * DK + tid];
    gt = bf16f(p.gate[size_t(b) * H * DV + h * DV + tid]);
    onw = p.o_norm[tid];
  }
  if (tid == 2 * 32) blog = bf16f(p.b[size_t(b) * H + h]);
  const int slot = p.slot[b];
  float4* Sg = reinterpret_cast<float4*>(p.S + (size_t(slot) * H + h) * DK * DV);
  float4 s[ROWS];
  uint16_t win[NE][3];
  auto load_state = [&] {
#pragma unroll
    for (int i = 0; i < ROWS; ++i)
      s[i] = KDA_DECODE_PROBE & 2 ? make_float4(1e-3f, 1e-3f, 1e-3f, 1e-3f)
                                  : Sg[(warp * ROWS + i) * (DV / 4) + lane];
  };
  auto load_window = [&] {
#pragma unroll
    for (int r = 0; r < NE; ++r) {
      const int e = tid + NT * r, m = e / DK, ch = h * DK + e % DK;
      if (e < 3 * DK) {
        const uint16_t* w = p.conv + (size_t(slot) * 9 + m * 3) * HK + ch;
        win[r][0] = w[0], win[r][1] = w[HK], win[r][2] = w[2 * HK];
      }
    }
  };
  if (KDA_DECODE_WIN_FIRST) {  // the window's 2.3 KB ahead of the 64 KB of state (the conv waits less)
    load_window();
    load_state();
  } else {
    load_state();
    load_window();
  }

  // Short conv (width 4) over the window [x_{t-3}, x_{t-2}, x_{t-1}] and x_t, SiLU, bf16; roll the window.
#pragma unroll
  for (int r = 0; r < NE; ++r) {
    const int e = tid + NT * r, m = e / DK, c = e % DK;
    if (e < 3 * DK) {
      const float4 w = cw[r];
      float y =
          w.x * bf16f(win[r][0]) + w.y * bf16f(win[r][1]) + w.z * bf16f(win[r][2]) + w.w * bf16f(cur[r]);
      y = y / (1.f + __expf(-y));
      x[m][c] = round_bf16(y);
      uint16_t* wp = p.conv + (size_t(slot) * 9 + m * 3) * HK + h * DK + c;
      wp[0] = win[r][1], wp[HK] = win[r][2], wp[2 * HK] = cur[r];
    }
  }
  if (tid < DK) alpha[tid] = __expf(p.g_lower / (1.f + __expf(-A * z)));
  __syncthreads();
  if (warp < 2) {  // warp 0: |q|, warp 1: |k|
    float ss = 0.f;
#pragma unroll
    for (int j = 0; j < 4; ++j) ss += x[warp][lane + 32 * j] * x[warp][lane + 32 * j];
    ss = warp_sum(ss);
    if (lane == 0) scal[warp] = rsqrtf(ss + 1e-6f) * (warp == 0 ? rsqrtf(float(DK)) : 1.f);
  } else if (warp == 2 && lane == 0) {
    scal[2] = 1.f / (1.f + __expf(-blog));
  }
  __syncthreads();
  const float sq = scal[0], sk = scal[1], beta = scal[2];
  // Decay rows, u partial = S^T k over this warp's rows.
  float4 part = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll
  for (int i = 0; i < ROWS; ++i) {
    const int a = warp * ROWS + i;
    const float al = alpha[a], ka = x[1][a] * sk;
    s[i].x *= al, s[i].y *= al, s[i].z *= al, s[i].w *= al;
    part.x += s[i].x * ka, part.y += s[i].y * ka, part.z += s[i].z * ka, part.w += s[i].w * ka;
  }
  reinterpret_cast<float4*>(red[0][warp])[lane] = part;
  __syncthreads();
  float4 u = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll
  for (int w = 0; w < NW; ++w) {
    const float4 r = reinterpret_cast<const float4*>(red[0][w])[lane];
    u.x += r.x, u.y += r.y, u.z += r.z, u.w += r.w;
  }
  const float4 v = reinterpret_cast<const float4*>(x[2])[lane];
  u = make_float4(beta * (v.x - u.x), beta * (v.y - u.y), beta * (v.z - u.z), beta * (v.w - u.w));
  part = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll
  for (int i = 0; i < ROWS; ++i) {  // S += k u^T; o partial = S^T q; write S back
    const int a = warp * ROWS + i;
    const float ka = x[1][a] * sk, qa = x[0][a] * sq;
    s[i].x += ka * u.x, s[i].y += ka * u.y, s[i].z += ka * u.z, s[i].w += ka * u.w;
    part.x += s[i].x * qa, part.y += s[i].y * qa, part.z += s[i].z * qa, part.w += s[i].w * qa;
    if (!(KDA_DECODE_PROBE & 1)) Sg[a * (DV / 4) + lane] = s[i];
  }
  reinterpret_cast<float4*>(red[1][warp])[lane] = part;
  __syncthreads();
  // o = bf16(sum of partials); gated RMSNorm over the head's 128 values.
  float o = 0.f;
  if (tid < DV) {
#pragma unroll
    for (int w = 0; w < NW; ++w) o += red[1][w][tid];
    o = round_bf16(o);
    const float ss = warp_sum(o * o);
    if (lane == 0) red[0][0][warp] = ss;
  }
  __syncthreads();
  if (tid < DV) {
    const float ms = (red[0][0][0] + red[0][0][1] + red[0][0][2] + red[0][0][3]) / float(DV);
    const float y = o * rsqrtf(ms + p.eps) * onw / (1.f + __expf(-gt));
    p.out[size_t(b) * H * DV + h * DV + tid] = __bfloat16_as_ushort(__float2bfloat16_rn(y));
  }
}

#endif  // !KDA_DECODE_SPLIT

#if KDA_DECODE_SPLIT
// Split version: a cluster of two CTAs per (head, sequence), CTA rank r owning the state columns
// 64r .. 64r+63 (the recurrence is independent per column of V). Both compute the q, k conv; each its half
// of v. The gated norm's mean over 128 columns adds the peer's half through distributed shared memory.
// The window is rolled after a cluster barrier, once both CTAs have read it.
namespace cg = cooperative_groups;
constexpr int HV = DV / 2, RR = DK / (2 * NW);  // columns per CTA; rows per thread (8)

__global__ void __cluster_dims__(2, 1, 1) __launch_bounds__(NT, 4)
    kda_decode_split_kernel(const KdaDecodeParams p) {
  __shared__ __align__(16) float x[3][DK];
  __shared__ float alpha[DK];
  __shared__ __align__(16) float red[2][2 * NW][HV];  // per (warp, half-warp) partial sums over 8 rows
  __shared__ float scal[4];
  __shared__ float ss_half;  // this CTA's sum of o^2 (read by the peer)
  cg::cluster_group cluster = cg::this_cluster();
  const int rank = int(cluster.block_rank()), h = blockIdx.x >> 1, b = blockIdx.y;
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, c4 = lane & 15, rg = 2 * warp + (lane >> 4);
  const int H = p.n_head, HK = H * DK, slot = p.slot[b], c0 = HV * rank;
  float4* Sg = reinterpret_cast<float4*>(p.S + (size_t(slot) * H + h) * DK * DV);
  float4 s[RR];  // rows 16 warp + 2 i + lane / 16, columns c0 + 4 (lane % 16) .. + 3
#pragma unroll
  for (int i = 0; i < RR; ++i) s[i] = Sg[(16 * warp + 2 * i + (lane >> 4)) * (DV / 4) + c0 / 4 + c4];

  uint16_t roll[2][3];  // the rolled window of this thread's channels, written at the end
  for (int r = 0; r < 2; ++r) {
    const int e = tid + NT * r;
    if (e >= 2 * DK + HV) break;
    const int m = e < DK ? 0 : (e < 2 * DK ? 1 : 2), c = m < 2 ? (e & (DK - 1)) : c0 + e - 2 * DK;
    const int ch = h * DK + c;
    const float4 w = reinterpret_cast<const float4*>(p.conv_w)[size_t(m) * HK + ch];
    const uint16_t* win = p.conv + (size_t(slot) * 9 + m * 3) * HK + ch;
    const uint16_t cur = p.qkv[(size_t(b) * 3 + m) * HK + ch];
    const uint16_t w0 = win[0], w1 = win[HK], w2 = win[2 * HK];
    float y = w.x * bf16f(w0) + w.y * bf16f(w1) + w.z * bf16f(w2) + w.w * bf16f(cur);
    y = y / (1.f + __expf(-y));
    x[m][c] = round_bf16(y);
    roll[r][0] = w1, roll[r][1] = w2, roll[r][2] = cur;
  }
  if (tid < DK) {
    const float A = __expf(p.A_log[h]);
    const float z = bf16f(p.f[size_t(b) * HK + h * DK + tid]) + p.dt_bias[h * DK + tid];
    alpha[tid] = __expf(p.g_lower / (1.f + __expf(-A * z)));
  }
  __syncthreads();
  if (warp < 2) {
    float ss = 0.f;
#pragma unroll
    for (int j = 0; j < 4; ++j) ss += x[warp][lane + 32 * j] * x[warp][lane + 32 * j];
    ss = warp_sum(ss);
    if (lane == 0) scal[warp] = rsqrtf(ss + 1e-6f) * (warp == 0 ? rsqrtf(float(DK)) : 1.f);
  } else if (warp == 2 && lane == 0) {
    scal[2] = 1.f / (1.f + __expf(-bf16f(p.b[size_t(b) * H + h])));
  }
  __syncthreads();
  const float sq = scal[0], sk = scal[1], beta = scal[2];
  float4 part = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll
  for (int i = 0; i < RR; ++i) {
    const int a = 16 * warp + 2 * i + (lane >> 4);
    const float al = alpha[a], ka = x[1][a] * sk;
    s[i].x *= al, s[i].y *= al, s[i].z *= al, s[i].w *= al;
    part.x += s[i].x * ka, part.y += s[i].y * ka, part.z += s[i].z * ka, part.w += s[i].w * ka;
  }
  reinterpret_cast<float4*>(red[0][rg])[c4] = part;
  __syncthreads();
  float4 u = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll
  for (int w = 0; w < 2 * NW; ++w) {
    const float4 r = reinterpret_cast<const float4*>(red[0][w])[c4];
    u.x += r.x, u.y += r.y, u.z += r.z, u.w += r.w;
  }
  const float4 v = reinterpret_cast<const float4*>(x[2] + c0)[c4];
  u = make_float4(beta * (v.x - u.x), beta * (v.y - u.y), beta * (v.z - u.z), beta * (v.w - u.w));
  part = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll
  for (int i = 0; i < RR; ++i) {
    const int a = 16 * warp + 2 * i + (lane >> 4);
    const float ka = x[1][a] * sk, qa = x[0][a] * sq;
    s[i].x += ka * u.x, s[i].y += ka * u.y, s[i].z += ka * u.z, s[i].w += ka * u.w;
    part.x += s[i].x * qa, part.y += s[i].y * qa, part.z += s[i].z * qa, part.w += s[i].w * qa;
    Sg[a * (DV / 4) + c0 / 4 + c4] = s[i];
  }
  reinterpret_cast<float4*>(red[1][rg])[c4] = part;
  __syncthreads();
  float o = 0.f;
  if (tid < HV) {
#pragma unroll
    for (int w = 0; w < 2 * NW; ++w) o += red[1][w][tid];
    o = round_bf16(o);
    const float ss = warp_sum(o * o);
    if (lane == 0) red[0][0][warp] = ss;
  }
  __syncthreads();
  if (tid == 0) ss_half = red[0][0][0] + red[0][0][1];
  cluster.sync();  // both halves' sums visible; both CTAs are done reading the conv window
  const float ss_peer = *cluster.map_shared_rank(&ss_half, rank ^ 1);
  for (int r = 0; r < 2; ++r) {  // roll the window: q, k by rank 0, each rank its half of v
    const int e = tid + NT * r;
    if (e >= 2 * DK + HV || (e < 2 * DK && rank != 0)) continue;
    const int m = e < DK ? 0 : (e < 2 * DK ? 1 : 2), c = m < 2 ? (e & (DK - 1)) : c0 + e - 2 * DK;
    uint16_t* win = p.conv + (size_t(slot) * 9 + m * 3) * HK + h * DK + c;
    win[0] = roll[r][0], win[HK] = roll[r][1], win[2 * HK] = roll[r][2];
  }
  if (tid < HV) {
    const float ms = (ss_half + ss_peer) / float(DV);
    const int c = c0 + tid;
    const float gt = bf16f(p.gate[size_t(b) * H * DV + h * DV + c]);
    const float y = o * rsqrtf(ms + p.eps) * p.o_norm[c] / (1.f + __expf(-gt));
    p.out[size_t(b) * H * DV + h * DV + c] = __bfloat16_as_ushort(__float2bfloat16_rn(y));
  }
  cluster.sync();  // the peer has read ss_half before this CTA's shared memory goes away
}

#endif  // KDA_DECODE_SPLIT

}  // namespace

// kda_fast_decode_tma.cu: the state bulk-copied into shared memory, 3 CTAs per SM; and the persistent
// version, one CTA per SM with a ring of 3 states.
Status kda_decode_fast_tma_cuda(const KdaDecodeParams& p, GpuContext& g);
Status kda_decode_fast_ring_cuda(const KdaDecodeParams& p, GpuContext& g);
// kda_fast_decode_cluster.cu: a cluster of CTAs per (head, sequence), each a slice of the state's columns.
Status kda_decode_fast_cluster_cuda(const KdaDecodeParams& p, GpuContext& g);

// KDA_DECODE_V=2 (default since session 7): the cluster kernel serves batches below kTmaMinSeq and every
// optional field but the traced intermediates, unless K3_KDA_DECODE_TMA forces one of the others. H200,
// bench_kda decode: b = 1 7.16-7.36 us (this file's kernel 8.60-8.85, the bulk-copy kernel 9.3-9.8); at
// b = 64 it moved the state at 0.820 of copy against 0.859 for the bulk-copy kernel, which keeps b >= 8.
// KDA_DECODE_V=1: no cluster kernel.
#ifndef KDA_DECODE_V
#define KDA_DECODE_V 2
#endif

// Which kernel: K3_KDA_DECODE_TMA=0 / 1 / 2 forces this file's kernel / the bulk-copy kernel / the persistent
// one; otherwise the bulk-copy kernel from kTmaMinSeq sequences. Measured on the H200 (session 4): at b = 64
// it moves the state at 0.86 of the copy rate against 0.76 for this file's kernel; at b = 1 it is slower
// (9.3-9.8 vs 8.8-9.2 us). Nothing was measured between.
constexpr int kTmaMinSeq = 8;

Status kda_decode_fast_cuda(const KdaDecodeParams& p, GpuContext& g) {
  Status st = kda_decode_fast_check(p);
  if (!st.ok()) return st;
  static const int forced = [] {
    const std::string e = env_value("K3_KDA_DECODE_TMA");
    return e == "0" ? 0 : e == "1" ? 1 : e == "2" ? 2 : -1;
  }();
  if (forced == 2) return kda_decode_fast_ring_cuda(p, g);
#if KDA_DECODE_V == 2
  const bool traced = p.q_out || p.k_out || p.v_out || p.g_out || p.beta_out || p.o_out;
  if (forced < 0 && !traced && p.n_seq < kTmaMinSeq) return kda_decode_fast_cluster_cuda(p, g);
#endif
  const bool extended = p.S_seq || p.conv_seq || p.conv_w_k || p.softplus_gate || p.q_out || p.g_out ||
                        p.o_out || p.S_inline[0] || p.x32[0] || p.out32;
  const bool tma = forced >= 0 ? forced == 1 : p.n_seq >= kTmaMinSeq;
  if (extended || tma) return kda_decode_fast_tma_cuda(p, g);
#if KDA_DECODE_SPLIT
  const dim3 grid(2 * unsigned(p.n_head), unsigned(p.n_seq));
  kda_decode_split_kernel<<<grid, NT, 0, g.stream>>>(p);
#else
  const dim3 grid(unsigned(p.n_head), unsigned(p.n_seq));
  kda_decode_kernel<<<grid, NT, 0, g.stream>>>(p);
#endif
  K3_CUDA_CHECK(cudaGetLastError());
  return ok_status();
}

}  // namespace k3
