// kda_fast_decode_cluster.cu: the third version of the fused KDA decode step (kda_fast.h), d_k = d_v = 128.
// The b < 8 decode kernel since session 7 (kda_fast_decode.cu's dispatch; -DKDA_DECODE_V=1 leaves it out).
// First H200 run (session 7, bench_kda decode; fp64 checks: b = 1 out 0, state 7.1e-8; b = 64 out 4.4e-5,
// state 1.8e-5): b = 1 7.16-7.36 us (-DKDA_DECODE_PDL=1 6.94-7.08; CL_SPLIT=2 7.7-7.9, =8 7.4-7.6;
// CL_MIN_BLOCKS=8 7.8-8.0; CL_CS=0 7.7-7.9). At b = 64 0.820 of copy (CL_CS=0: 0.866; the bulk-copy
// kernel the dispatch keeps there: 0.859).
//
// The delta rule is independent per column j of V:  S[:, j] <- alpha * S[:, j];
// u_j = beta (v_j - S[:, j] . k);  S[:, j] += k u_j;  o_j = S[:, j] . q.  Only the gated RMSNorm (mean of
// o^2 over the 128 columns) couples them. So each (head, sequence) is a cluster of CS CTAs (4 warps each),
// CTA rank r owning the state columns NC r .. NC r + NC - 1 (NC = 128 / CS), 16 KB of the 64 KB at CS = 4:
//   * the state slice is loaded into registers right after the slot (thread t: column quad t % NQ, rows
//     t / NQ + RPI i), behind only the conv window's few bytes, so the prologue runs while it streams in;
//   * the prologue is shared, not repeated: rank r computes conv + SiLU of q~, k~ channels
//     CH r .. CH r + CH - 1 (CH = 128 / CS), of v~ for its own columns, and alpha = exp(g) of rows
//     CH r .. + CH - 1, and stores the q~, k~, alpha values into every CTA of the cluster (st.async into
//     distributed shared memory, counted on the receiver's mbarrier); then every warp forms |q|, |k| itself
//     (same sums in the same order everywhere: identical values in every CTA);
//   * each rank rolls the window of the channels it read (no other CTA reads them);
//   * the sum of o^2 over its NC columns goes to every CTA the same way, then the gated norm (at CS = 4 the
//     mean is grouped and added as in kda_fast_decode.cu's kernel: four 32-column sums, in column order).
// No release barrier once the state loads or stores are in flight (a release would wait for them): one
// relaxed cluster arrive at the start, its wait before the first remote store (the peers are running, their
// mbarriers armed); after that only mbarrier waits (acquire) and CTA barriers.
// The grid has CS x more CTAs (384 at b = 1 with 96 heads: every SM of an H200 moves state, ~48 KB each way,
// instead of 96 SMs moving 64 KB), each small enough (128 threads) that several share an SM at b = 64.
// Sums over rows: each thread's rows, then a butterfly over the lanes of its column quad, then the 4 warps
// through shared memory. Not served here (the caller uses kda_fast_decode_tma.cu): the traced intermediates.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <atomic>

#include "core/cuda_check.h"
#include "ops/cuda_mma.cuh"
#include "ops/kda_fast.h"
#include "ops/kda_fast_decode_io.cuh"

namespace k3 {
namespace {

#ifndef KDA_DECODE_CL_SPLIT  // CTAs per (head, sequence) = cluster size (2, 4 or 8)
#define KDA_DECODE_CL_SPLIT 4
#endif
#ifndef KDA_DECODE_CL_MIN_BLOCKS  // CTAs per SM the register budget is sized for
#define KDA_DECODE_CL_MIN_BLOCKS (KDA_DECODE_CL_SPLIT == 2 ? 3 : KDA_DECODE_CL_SPLIT == 4 ? 6 : 8)
#endif
#ifndef KDA_DECODE_CL_CS  // 1: streaming cache hints (ld/st .cs, evict first) on the state
#define KDA_DECODE_CL_CS 1
#endif
#ifndef KDA_DECODE_CL_SPREAD  // 1: ask for the cluster's CTAs spread over SMs
                              // (cudaClusterSchedulingPolicySpread)
#define KDA_DECODE_CL_SPREAD 1
#endif
// 1: programmatic dependent launch. The launch lets the next kernel of the stream start its prologue early
// (griddepcontrol.launch_dependents), and this kernel only loads weights before griddepcontrol.wait, which
// returns once the previous kernel of the stream has completed and its memory is visible.
#ifndef KDA_DECODE_PDL
#define KDA_DECODE_PDL 0
#endif

constexpr int DK = 128, DV = 128, NT = 128, NW = NT / 32;
constexpr int CS = KDA_DECODE_CL_SPLIT;
constexpr int NC = DV / CS;                 // state columns per CTA
constexpr int CH = DK / CS;                 // q~, k~ channels and alpha rows this CTA's prologue computes
constexpr int NQ = NC / 4;                  // float4 column quads per row of the slice
constexpr int RPI = NT / NQ;                // rows one load of all threads covers
constexpr int NR = DK / RPI;                // rows per thread
constexpr int NE = (4 * CH + NT - 1) / NT;  // prologue items per thread (q~, k~, v~ channels, alpha rows)
constexpr int OPL = (NC + 31) / 32;         // o columns per lane of warp 0
static_assert(CS == 2 || CS == 4 || CS == 8, "cluster of 2, 4 or 8 CTAs per (head, sequence)");
static_assert(NC == CH, "rank r's v~ channels are its state columns");

__device__ inline float bf16f(uint16_t x) {
  return __uint_as_float(uint32_t(x) << 16);
}
__device__ inline float round_bf16(float x) {
  return __bfloat162float(__float2bfloat16_rn(x));
}
__device__ inline float sigm(float x) {
  return 1.f / (1.f + __expf(-x));
}
__device__ inline float warp_sum(float x) {  // xor butterfly: every lane ends with the same bits
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) x += __shfl_xor_sync(0xffffffffu, x, o);
  return x;
}
__device__ inline void fma4(float4& acc, const float4& s, float w) {
  acc.x += s.x * w, acc.y += s.y * w, acc.z += s.z * w, acc.w += s.w * w;
}
// Sum over the lanes of one column quad (lanes equal mod NQ); every such lane ends with the same bits.
__device__ inline float4 quad_sum(float4 a) {
#pragma unroll
  for (int o = NQ; o < 32; o <<= 1) {
    a.x += __shfl_xor_sync(0xffffffffu, a.x, o), a.y += __shfl_xor_sync(0xffffffffu, a.y, o);
    a.z += __shfl_xor_sync(0xffffffffu, a.z, o), a.w += __shfl_xor_sync(0xffffffffu, a.w, o);
  }
  return a;
}

__device__ inline float4 ld_state(const float4* p) {
#if KDA_DECODE_CL_CS
  return __ldcs(p);
#else
  return *p;
#endif
}
__device__ inline void st_state(float4* p, const float4& v) {
#if KDA_DECODE_CL_CS
  __stcs(p, v);
#else
  *p = v;
#endif
}

__device__ inline uint32_t cluster_rank() {
  uint32_t r;
  asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(r));
  return r;
}
__device__ inline void cluster_arrive_relaxed() {
  asm volatile("barrier.cluster.arrive.relaxed.aligned;" ::: "memory");
}
__device__ inline void cluster_wait() {  // acquire: a no-op for the loads still in flight
  asm volatile("barrier.cluster.wait.acquire.aligned;" ::: "memory");
}
__global__ void __cluster_dims__(CS, 1, 1) __launch_bounds__(NT, KDA_DECODE_CL_MIN_BLOCKS)
    kda_decode_cluster_kernel(const KdaDecodeParams p) {
  __shared__ __align__(16) float xq[DK], xk[DK];  // q~, k~ (bf16 values), all 128 channels (from the cluster)
  __shared__ __align__(16) float xv[NC];          // v~ of this CTA's columns
  __shared__ float alpha[DK];                     // exp(g), all 128 rows (from the cluster)
  __shared__ __align__(16) float red[2][NW][NC];  // per-warp partial sums: S^T k, then S^T q
  __shared__ float ssum[CS];                      // sum of o^2 over each rank's columns
  __shared__ uint64_t bar[2];  // complete when [0]: xq, xk, alpha are all here; [1]: ssum is
  const uint32_t rank = cluster_rank();
  const int h = int(blockIdx.x) / CS, b = blockIdx.y, tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int H = p.n_head, HK = H * DK, c0 = int(rank) * NC;
  const int c4 = tid % NQ, r0 = tid / NQ;  // this thread's column quad and first row
  if (tid == 0) {  // each mbarrier: one arrival (here) and the bytes the cluster's st.async will bring
    mbar_init(smem_addr(&bar[0]), 1);
    mbar_init(smem_addr(&bar[1]), 1);
    mbar_expect_tx(smem_addr(&bar[0]), (CS - 1) * 3 * CH * 4);
    mbar_expect_tx(smem_addr(&bar[1]), (CS - 1) * 4);
    fence_mbar_init();
  }
  cluster_arrive_relaxed();  // every CTA of the cluster has started, its mbarriers set (before any st.async)

  // Weights first (no earlier kernel writes them), then, after the grid dependency when launched with PDL,
  // the step's inputs, the slot, the window and the state slice.
  float4 cw[NE];
  float dtb[NE];
  float A = 0.f;
#pragma unroll
  for (int r = 0; r < NE; ++r) {
    const int e = tid + NT * r, m = e / CH, c = int(rank) * CH + e % CH, ch = h * DK + c;
    if (e < 4 * CH) {
      if (m < 3) {
        const float* w =
            m == 0 || !p.conv_w_k ? p.conv_w + size_t(m) * HK * 4 : (m == 1 ? p.conv_w_k : p.conv_w_v);
        cw[r] = reinterpret_cast<const float4*>(w)[ch];
      } else {
        dtb[r] = p.dt_bias[ch];
        A = __expf(p.A_log[h]);
      }
    }
  }
  float onw[OPL];
#pragma unroll
  for (int k = 0; k < OPL; ++k) onw[k] = warp == 0 && lane + 32 * k < NC ? p.o_norm[c0 + lane + 32 * k] : 0.f;
#if KDA_DECODE_PDL
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
  uint16_t cur[NE];
  float fz[NE];
#pragma unroll
  for (int r = 0; r < NE; ++r) {
    const int e = tid + NT * r, m = e / CH, ch = h * DK + int(rank) * CH + e % CH;
    if (e < 4 * CH) {
      if (m < 3)
        cur[r] = kda_io::qkv(p, b, m, ch);
      else
        fz[r] = kda_io::f(p, b, ch);
    }
  }
  float gt[OPL];
#pragma unroll
  for (int k = 0; k < OPL; ++k)
    gt[k] = warp == 0 && lane + 32 * k < NC ? kda_io::gate(p, b, h * DV + c0 + lane + 32 * k) : 0.f;
  const float blog = kda_io::beta_logit(p, b, h);
  float* Sbase = kda_io::state(p, b);
  uint16_t* conv = kda_io::window(p, b);
  uint16_t win[NE][3];  // the window's few bytes before the state's 16 KB
#pragma unroll
  for (int r = 0; r < NE; ++r) {
    const int e = tid + NT * r, m = e / CH, ch = h * DK + int(rank) * CH + e % CH;
    if (e < 4 * CH && m < 3) {
      const uint16_t* w = conv + size_t(m) * 3 * HK + ch;
      win[r][0] = w[0], win[r][1] = w[HK], win[r][2] = w[2 * HK];
    }
  }
  float4* Sg = reinterpret_cast<float4*>(Sbase + size_t(h) * DK * DV) + c0 / 4 + c4;  // row a: Sg[a * DV / 4]
  float4 s[NR];
#pragma unroll
  for (int i = 0; i < NR; ++i) s[i] = ld_state(Sg + (r0 + RPI * i) * (DV / 4));

  // Prologue items: conv + SiLU (bf16) of q~, k~, v~ channels, roll of their window; alpha of rows.
  float val[NE];
#pragma unroll
  for (int r = 0; r < NE; ++r) {
    const int e = tid + NT * r, m = e / CH, c = int(rank) * CH + e % CH;
    if (e < 4 * CH) {
      if (m < 3) {
        const float4 w = cw[r];
        const float y =
            w.x * bf16f(win[r][0]) + w.y * bf16f(win[r][1]) + w.z * bf16f(win[r][2]) + w.w * bf16f(cur[r]);
        val[r] = round_bf16(y * sigm(y));
        uint16_t* wp = conv + size_t(m) * 3 * HK + h * DK + c;  // only this CTA reads these channels
        wp[0] = win[r][1], wp[HK] = win[r][2], wp[2 * HK] = cur[r];
      } else {
        const float z = fz[r] + dtb[r];
        const float g = p.softplus_gate ? -A * (z > 20.f ? z : log1pf(expf(z))) : p.g_lower * sigm(A * z);
        val[r] = __expf(g);
      }
    }
  }
  cluster_wait();  // every CTA is running, its mbarriers armed: its shared memory may be written
#pragma unroll
  for (int r = 0; r < NE; ++r) {
    const int e = tid + NT * r, m = e / CH, c = int(rank) * CH + e % CH;
    if (e < 4 * CH) {
      if (m == 2) {
        xv[c - c0] = val[r];
      } else {
        float* dst = m == 0 ? xq + c : (m == 1 ? xk + c : alpha + c);
#pragma unroll
        for (int q = 0; q < CS; ++q) {
          if (q == int(rank))
            *dst = val[r];
          else
            st_async(smem_addr(dst), smem_addr(&bar[0]), uint32_t(q), __float_as_uint(val[r]));
        }
      }
    }
  }
  mbar_wait_parity<true>(smem_addr(&bar[0]), 0);  // the other ranks' q~, k~, alpha are here
  __syncthreads();      // and this CTA's (a CTA barrier does not wait for the state loads in flight)
  float sq, sk;
  {  // |q|, |k| in every warp (no barrier): lanes hold channels lane + 32 j
    float a = 0.f, c = 0.f;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const float qv = xq[lane + 32 * j], kv = xk[lane + 32 * j];
      a += qv * qv, c += kv * kv;
    }
    sq = rsqrtf(warp_sum(a) + 1e-6f) * rsqrtf(float(DK));
    sk = rsqrtf(warp_sum(c) + 1e-6f);
  }
  const float beta = sigm(blog);

  // u = beta (v - (diag(alpha) S)^T k) over this CTA's columns
  float4 part = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll
  for (int i = 0; i < NR; ++i) {
    const int a = r0 + RPI * i;
    const float al = alpha[a];
    s[i].x *= al, s[i].y *= al, s[i].z *= al, s[i].w *= al;
    fma4(part, s[i], xk[a] * sk);
  }
  part = quad_sum(part);
  if (lane < NQ) reinterpret_cast<float4*>(red[0][warp])[lane] = part;
  __syncthreads();
  float4 u = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll
  for (int w = 0; w < NW; ++w) {
    const float4 t = reinterpret_cast<const float4*>(red[0][w])[c4];
    u.x += t.x, u.y += t.y, u.z += t.z, u.w += t.w;
  }
  {
    const float4 v = reinterpret_cast<const float4*>(xv)[c4];
    u = make_float4(beta * (v.x - u.x), beta * (v.y - u.y), beta * (v.z - u.z), beta * (v.w - u.w));
  }
  // S += k u^T, written back; o partial = S^T q
  part = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll
  for (int i = 0; i < NR; ++i) {
    const int a = r0 + RPI * i;
    const float ka = xk[a] * sk;
    s[i].x += ka * u.x, s[i].y += ka * u.y, s[i].z += ka * u.z, s[i].w += ka * u.w;
    fma4(part, s[i], xq[a] * sq);
    st_state(Sg + a * (DV / 4), s[i]);
  }
  part = quad_sum(part);
  if (lane < NQ) reinterpret_cast<float4*>(red[1][warp])[lane] = part;
  __syncthreads();
  float o[OPL];
  if (warp == 0) {  // o = bf16(S^T q) of this CTA's columns; their sum of o^2 to every CTA of the cluster
    float ss = 0.f;
#pragma unroll
    for (int k = 0; k < OPL; ++k) {
      o[k] = 0.f;
      const int j = lane + 32 * k;
      if (j < NC) {
#pragma unroll
        for (int w = 0; w < NW; ++w) o[k] += red[1][w][j];
        o[k] = round_bf16(o[k]);
        ss += o[k] * o[k];
      }
    }
    ss = warp_sum(ss);
    if (lane == int(rank))
      ssum[rank] = ss;
    else if (lane < CS)
      st_async(smem_addr(&ssum[rank]), smem_addr(&bar[1]), uint32_t(lane), __float_as_uint(ss));
  }
  // Warps 1..3 are done. Every remote store into a CTA is counted by one of its mbarriers, which it waits
  // for before it exits: no CTA's shared memory is written after its exit.
  if (warp == 0) {
    mbar_wait_parity<true>(smem_addr(&bar[1]), 0);  // the other ranks' sums of o^2 are here
    __syncwarp();         // and this rank's, from lane `rank`
    float ms = 0.f;
#pragma unroll
    for (int q = 0; q < CS; ++q) ms += ssum[q];
    const float rs = rsqrtf(ms / float(DV) + p.eps);
#pragma unroll
    for (int k = 0; k < OPL; ++k) {
      const int j = lane + 32 * k;
      if (j < NC) {
        const float y = o[k] * rs * onw[k] * sigm(gt[k]);
        kda_io::store_out(p, b, h * DV + c0 + j, y);
      }
    }
  }
}

}  // namespace

// Called by kda_decode_fast_cuda (kda_fast_decode.cu) after the shape check, without traced intermediates.
Status kda_decode_fast_cluster_cuda(const KdaDecodeParams& p, GpuContext& g) {
#if KDA_DECODE_CL_SPREAD
  static std::atomic<bool> done[64] = {};
  int dev = 0;
  K3_CUDA_CHECK(cudaGetDevice(&dev));
  if (dev >= 64 || !done[dev].load()) {  // a host-side attribute, once per device (not a stream operation)
    if (cudaFuncSetAttribute(kda_decode_cluster_kernel, cudaFuncAttributeClusterSchedulingPolicyPreference,
                             int(cudaClusterSchedulingPolicySpread)) != cudaSuccess)
      (void)cudaGetLastError();  // a preference only: the default placement if refused
    if (dev < 64) done[dev] = true;
  }
#endif
  const dim3 grid(unsigned(CS * p.n_head), unsigned(p.n_seq));
#if KDA_DECODE_PDL
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = grid, cfg.blockDim = dim3(NT), cfg.dynamicSmemBytes = 0, cfg.stream = g.stream;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = attr, cfg.numAttrs = 1;
  K3_CUDA_CHECK(cudaLaunchKernelEx(&cfg, kda_decode_cluster_kernel, p));
#else
  // (clang-format does not parse this branch as CUDA and would split the launch brackets)
  // clang-format off
  kda_decode_cluster_kernel<<<grid, NT, 0, g.stream>>>(p);
  // clang-format on
#endif
  K3_CUDA_CHECK(cudaGetLastError());
  return ok_status();
}

}  // namespace k3
