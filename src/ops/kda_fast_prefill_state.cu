// kda_fast_prefill_state.cu: the state-dependent half of the two-kernel chunkwise KDA prefill (kda_fast.h)
// and the entry point kda_prefill_fast_cuda: the two-kernel version by default (checked and timed on the H200
// in session 4), the one-kernel one (kda_fast_prefill.cu) with K3_KDA_PREFILL_SPLIT=0. One CTA (8 warps) per
// (slice of VB value columns, head, sequence) walks the sequence's chunks in order with its fp32 state slice
// S [128, VB] in registers (warp w: rows 16w..16w+15) and a tf32 copy in shared memory (the B operand). Per
// chunk, from the scratch of kda_fast_prefill_intra.cu:
//   1. V' = T (beta V) + (-W) S  (warps 0-3, rows 16w..)     O = Qe S  (warps 4-7)
//   2. O += A V'; o = bf16(O)  (warps 4-7)          S <- diag(exp(G_C)) S + Kd^T V'  (all warps)
// The value columns are independent in the recurrence, so the slices need no communication.
// The batch's chunks are processed in windows that fit the workspace: the intra kernel fills the scratch of
// a window, this kernel walks it, the state goes through its cache slot between windows; with two windows'
// room the next window's pre-pass runs on a side stream while this one is walked.
#include <cuda_bf16.h>

#include <algorithm>
#include <cstdlib>
#include <mutex>
#include <string>

#include "core/cuda_check.h"
#include "core/env.h"
#include "ops/cuda_mma.cuh"
#include "ops/kda_fast_prefill.cuh"

namespace k3 {
namespace kdapre {

size_t intra_smem_bytes();
cudaError_t launch_intra(const KdaPrefillParams& p, uint32_t* ws, int64_t c0, int n_chunk, cudaStream_t st);

namespace {

constexpr int NT = 256;
// CTAs per SM the state kernel's registers are sized for (2: 127 registers; 3: 80 with ~180 bytes of spills,
// so 384 CTAs of VB = 32 for 96 heads fit one wave of 396 instead of two of 264). Bench builds only.
#ifndef KDA_STATE_MIN_BLOCKS
#define KDA_STATE_MIN_BLOCKS 2
#endif
// 1: Kd^T's fragments (and the output warps' A) are loaded after phase 1 instead of with the others, so fewer
// registers are live in phase 1 (for KDA_STATE_MIN_BLOCKS=3). Bench builds only.
#ifndef KDA_STATE_LATE_LOADS
#define KDA_STATE_LATE_LOADS 0
#endif
constexpr bool kLateLoads = KDA_STATE_LATE_LOADS;
// 1: the chunk's scratch (66 KB) is staged in shared memory by one bulk copy (the TMA unit), issued a chunk
// ahead: the copy for chunk c + 1 starts once every thread has read chunk c's fragments (the first barrier),
// so its L2 latency hides behind a step instead of stalling the step's first MMAs (Nsight, session 18:
// long-scoreboard stalls were 20% of the walk's samples). 107 KB of shared memory: still 2 CTAs an SM.
// The default since session 19 (H100: prefill T = 8192 2.380 -> 2.311 ms, every fp64 check digit the same).
#ifndef KDA_STATE_STAGE
#define KDA_STATE_STAGE 1
#endif
constexpr bool kStage = KDA_STATE_STAGE;
static_assert(!(kStage && kLateLoads), "the staged scratch is overwritten after the first barrier");
// 1: the B operands (S, beta V, V') sit in shared memory transposed, [n][k], and each n-tile's fragments of a
// 16-wide k-step come from one ldmatrix.x4 (tf32 words read as pairs of b16) instead of four 32-bit loads
// (Nsight, session 18: the LSU was the busiest pipe, 44% of issue). Same products, same order.
#ifndef KDA_STATE_LDSM
#define KDA_STATE_LDSM 0
#endif
constexpr bool kLdsm = KDA_STATE_LDSM;

// B operands [k][n], ld = VB + 8 (= 8 mod 32: conflict-free fragment reads), or with kLdsm [n][k], ld = K + 4
// (= 4 mod 32: conflict-free ldmatrix rows, 16-byte aligned).
template <int VB>
struct StateSmem {
  static constexpr int LD = kLdsm ? DK + 4 : VB + 8;  // S (K = 128)
  static constexpr int LDV = kLdsm ? C + 4 : VB + 8;  // V', beta V (K = 64)
  uint32_t S[kLdsm ? VB * LD : DK * LD];              // tf32 copy of the state slice
  uint32_t Vp[kLdsm ? VB * LDV : C * LDV];            // V' (tf32)
  uint32_t bV[kLdsm ? VB * LDV : C * LDV];            // beta v, this CTA's columns (tf32)
};
// Word of B element (k, n) in either layout.
__device__ __forceinline__ int b_at(int k, int n, int ld) {
  return kLdsm ? n * ld + k : k * ld + n;
}
// acc (16 x 8 NTL) += A (one 16-wide k-step, packed fp16 pairs) B[k0 .. k0 + 16, :] from shared memory.
template <int NTL>
__device__ __forceinline__ void mma_b16(float (&acc)[NTL][4], const uint4& a, const uint32_t* X, int ld,
                                        int k0) {
  if constexpr (!kLdsm) {
    mma_k16(acc, a, X, ld, k0);
  } else {
    uint32_t a0[4], a1[4];
    unpack_a(a, a0, a1);
    const int lane = threadIdx.x & 31;
    // lanes 8m .. 8m + 7 address rows n = 8 j + (lane & 7), words k0 + 4 m ..: matrix m = b0, b1 of the
    // first k8 step, then b0, b1 of the second.
    const uint32_t base = smem_addr(X + (lane & 7) * ld + k0 + 4 * (lane >> 3));
#pragma unroll
    for (int j = 0; j < NTL; ++j) {
      uint32_t b[4];
      ldsm_x4(base + uint32_t(8 * j * ld * 4), b);
      const uint32_t b0[2] = {b[0], b[1]}, b1[2] = {b[2], b[3]};
      mma_tf32(acc[j], a0, b0);
      mma_tf32(acc[j], a1, b1);
    }
  }
}
// kStage: the staged scratch and its mbarrier follow StateSmem (both offsets multiples of 16 bytes).
template <int VB>
constexpr size_t state_smem_bytes() {
  return sizeof(StateSmem<VB>) + (kStage ? CHUNK_BYTES + 16 : 0);
}

// This thread's share of a chunk's beta v columns: 64 rows x VB columns, 8 bf16 per 16-byte load.
template <int VB>
struct VRegs {
  static constexpr int N = C * VB / 8 / NT > 0 ? C * VB / 8 / NT : 1;
  uint4 v[N];
  float beta[N];
};
template <int VB>
__device__ __forceinline__ void load_v(VRegs<VB>& r, const KdaPrefillParams& p, int64_t t0, int n, int h, int vs) {
#pragma unroll
  for (int m = 0; m < VRegs<VB>::N; ++m) {
    const int e = threadIdx.x + NT * m, i = e / (VB / 8), c8 = e % (VB / 8);
    const bool in = e < C * VB / 8 && i < n;
    r.v[m] = in ? __ldg(reinterpret_cast<const uint4*>(p.v + (size_t(t0 + i) * p.n_head + h) * 128 + vs * VB + 8 * c8))
                : make_uint4(0, 0, 0, 0);
    r.beta[m] = in ? __ldg(p.beta + size_t(t0 + i) * p.n_head + h) : 0.f;
  }
}

template <int VB>
__global__ void __launch_bounds__(NT, KDA_STATE_MIN_BLOCKS)
    kda_state_kernel(const KdaPrefillParams p, const uint32_t* ws, int64_t c0, int64_t c1) {
  constexpr int NTL = VB / 8, LD = StateSmem<VB>::LD, LDV = StateSmem<VB>::LDV;
  extern __shared__ float4 smem_f4[];
  auto& sm = *reinterpret_cast<StateSmem<VB>*>(smem_f4);
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, t = lane & 3;
  const int vs = blockIdx.x, h = blockIdx.y, s = blockIdx.z, H = p.n_head;
  int64_t base = 0;  // the sequence's first padded chunk index
  for (int x = 0; x < s; ++x) base += (int64_t(p.cu_seqlens[x + 1]) - p.cu_seqlens[x] + C - 1) / C;
  const int64_t tok0 = p.cu_seqlens[s], len = p.cu_seqlens[s + 1] - tok0, nc = (len + C - 1) / C;
  const int64_t cb = base > c0 ? base : c0, ce = base + nc < c1 ? base + nc : c1;
  const bool empty_seq = nc == 0 && c0 == 0;  // still owes its slot a zero state
  if (cb >= ce && !empty_seq) return;
  const int slot = p.slot ? p.slot[s] : s;
  float* Sg = p.S + (size_t(slot) * H + h) * DK * 128 + vs * VB;  // this CTA's [128][VB] columns
  const bool zero = p.zero_initial_state && (cb == base || empty_seq);
  const int d0 = 16 * warp;
  float sacc[NTL][4];
#pragma unroll
  for (int j = 0; j < NTL; ++j)
#pragma unroll
    for (int c = 0; c < 4; ++c) {
      const int d = d0 + g + 8 * (c >> 1), col = 8 * j + 2 * t + (c & 1);
      sacc[j][c] = zero ? 0.f : Sg[size_t(d) * 128 + col];
    }
  const int mt = warp & 3;
  const bool o_warp = warp >= 4;
  auto rows_of = [&](int64_t c) { return int(len - (c - base) * C < C ? len - (c - base) * C : C); };
  VRegs<VB> vin;
  if (cb < ce) load_v<VB>(vin, p, tok0 + (cb - base) * C, rows_of(cb), h, vs);
  uint32_t* stg = reinterpret_cast<uint32_t*>(smem_f4) + sizeof(StateSmem<VB>) / 4;  // kStage only
  const uint32_t bar = smem_addr(stg + CHUNK_WORDS);
  auto stage = [&](int64_t c) {  // thread 0: chunk c's scratch -> stg, completing on bar
    mbar_expect_tx(bar, uint32_t(CHUNK_BYTES));
    bulk_g2s(smem_addr(stg), ws + (size_t(c - c0) * H + h) * CHUNK_WORDS, uint32_t(CHUNK_BYTES), bar);
  };
  if constexpr (kStage) {
    if (cb < ce) {
      if (tid == 0) {
        mbar_init(bar, 1);
        fence_mbar_init();
        fence_proxy_async();
        stage(cb);
      }
      __syncthreads();  // the mbarrier's init before anyone waits on it
    }
  }
  for (int64_t c = cb; c < ce; ++c) {
    const uint32_t* scr_g = ws + (size_t(c - c0) * H + h) * CHUNK_WORDS;
    if (vs == 0 && tid == 0 && c + 1 < ce) {  // the next chunk's scratch into L2 while this one runs
      const uint32_t* nx = scr_g + size_t(H) * CHUNK_WORDS;
      asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(nx), "r"(uint32_t(CHUNK_BYTES)) : "memory");
    }
    if constexpr (kStage) mbar_wait_parity(bar, uint32_t(c - cb) & 1u);
    const uint32_t* scr = kStage ? stg : scr_g;
    // ld: the scratch's words (shared memory when staged, else read-only global loads)
    auto ld4 = [&](const uint4* a) { return kStage ? *a : __ldg(a); };
    auto ld1 = [&](const uint32_t* a) { return kStage ? *a : __ldg(a); };
    // Every scratch read of this chunk in flight at once, before the barrier: Qe or -W (phase 1), T or A
    // (pairs <= mt: phase 1 for warps 0-3, phase 2 for warps 4-7), Kd^T (phase 2), the decay.
    const float dec0 = __uint_as_float(ld1(scr + OFF_DC + d0 + g));
    const float dec1 = __uint_as_float(ld1(scr + OFF_DC + d0 + g + 8));
    const uint4* X = reinterpret_cast<const uint4*>(scr + (o_warp ? OFF_QE : OFF_WN));
    uint4 af[8], tf[4], kf[4];
#pragma unroll
    for (int pp = 0; pp < 8; ++pp) af[pp] = ld4(X + frag_at(mt, pp, 8, lane));
    const uint4* TA = reinterpret_cast<const uint4*>(scr + (o_warp ? OFF_AF : OFF_TF));
    const uint4* Kt = reinterpret_cast<const uint4*>(scr + OFF_KT);
    auto load_tf = [&] {
#pragma unroll
      for (int pp = 0; pp < 4; ++pp)
        tf[pp] = pp <= mt ? ld4(TA + frag_at(mt, pp, 4, lane)) : make_uint4(0, 0, 0, 0);
    };
    auto load_kf = [&] {
#pragma unroll
      for (int pp = 0; pp < 4; ++pp) kf[pp] = ld4(Kt + frag_at(warp, pp, 4, lane));
    };
    if (!kLateLoads || !o_warp) load_tf();
    if (!kLateLoads) load_kf();
#pragma unroll
    for (int j = 0; j < NTL; ++j)
#pragma unroll
      for (int c2 = 0; c2 < 4; ++c2)
        sm.S[b_at(d0 + g + 8 * (c2 >> 1), 8 * j + 2 * t + (c2 & 1), LD)] = to_tf32(sacc[j][c2]);
#pragma unroll
    for (int m = 0; m < VRegs<VB>::N; ++m) {
      const int e = tid + NT * m, i = e / (VB / 8), c8 = e % (VB / 8);
      if (e < C * VB / 8) {
        const uint32_t w[4] = {vin.v[m].x, vin.v[m].y, vin.v[m].z, vin.v[m].w};
#pragma unroll
        for (int x = 0; x < 4; ++x) {
          sm.bV[b_at(i, 8 * c8 + 2 * x, LDV)] = to_tf32(vin.beta[m] * __uint_as_float(w[x] << 16));
          sm.bV[b_at(i, 8 * c8 + 2 * x + 1, LDV)] =
              to_tf32(vin.beta[m] * __uint_as_float(w[x] & 0xffff0000u));
        }
      }
    }
    __syncthreads();
    if (kStage && tid == 0 && c + 1 < ce) {  // every read of stg is done: the next chunk's copy
      fence_proxy_async();
      stage(c + 1);
    }
    if (c + 1 < ce) load_v<VB>(vin, p, tok0 + (c + 1 - base) * C, rows_of(c + 1), h, vs);  // in flight meanwhile
    // 1. V' = T (beta V) - W S (warps 0-3) or O = Qe S (warps 4-7), rows 16 mt.., all VB columns.
    float acc[NTL][4];
#pragma unroll
    for (int j = 0; j < NTL; ++j) acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.f;
    if (!o_warp) {
#pragma unroll
      for (int pp = 0; pp < 4; ++pp) {
        if (pp <= mt) {
          mma_b16(acc, tf[pp], sm.bV, LDV, 16 * pp);
        }
      }
    }
#pragma unroll
    for (int pp = 0; pp < 8; ++pp) {
      mma_b16(acc, af[pp], sm.S, LD, 16 * pp);
    }
    if (kLateLoads) {
      if (o_warp) load_tf();
      load_kf();
    }
    if (!o_warp) {
#pragma unroll
      for (int j = 0; j < NTL; ++j)
#pragma unroll
        for (int c2 = 0; c2 < 4; ++c2)
          sm.Vp[b_at(16 * mt + g + 8 * (c2 >> 1), 8 * j + 2 * t + (c2 & 1), LDV)] = to_tf32(acc[j][c2]);
    }
    __syncthreads();
    // 2. O += A V' (A is lower triangular: k-step pairs <= mt); S <- exp(G_C) S + Kd^T V'.
    if (o_warp) {
#pragma unroll
      for (int pp = 0; pp < 4; ++pp) {
        if (pp <= mt) {
          mma_b16(acc, tf[pp], sm.Vp, LDV, 16 * pp);
        }
      }
      const int64_t t0 = tok0 + (c - base) * C;
      const int n = rows_of(c);
#pragma unroll
      for (int j = 0; j < NTL; ++j)
#pragma unroll
        for (int hh = 0; hh < 2; ++hh) {
          const int i = 16 * mt + g + 8 * hh;
          if (i < n)
            *reinterpret_cast<__nv_bfloat162*>(p.o + (size_t(t0 + i) * H + h) * 128 + vs * VB + 8 * j + 2 * t) =
                __floats2bfloat162_rn(acc[j][2 * hh], acc[j][2 * hh + 1]);
        }
    }
#pragma unroll
    for (int j = 0; j < NTL; ++j) {
      sacc[j][0] *= dec0, sacc[j][1] *= dec0, sacc[j][2] *= dec1, sacc[j][3] *= dec1;
    }
#pragma unroll
    for (int pp = 0; pp < 4; ++pp) {
      mma_b16(sacc, kf[pp], sm.Vp, LDV, 16 * pp);
    }
    __syncthreads();  // Vp, S and bV reads done before the next chunk writes them
  }
#pragma unroll
  for (int j = 0; j < NTL; ++j)
#pragma unroll
    for (int hh = 0; hh < 2; ++hh) {
      const int d = d0 + g + 8 * hh;
      *reinterpret_cast<float2*>(Sg + size_t(d) * 128 + 8 * j + 2 * t) = make_float2(sacc[j][2 * hh], sacc[j][2 * hh + 1]);
    }
}

template <int VB>
cudaError_t launch_state(const KdaPrefillParams& p, const uint32_t* ws, int64_t c0, int64_t c1, cudaStream_t st) {
  const size_t smem = state_smem_bytes<VB>();
  cudaError_t e = cudaFuncSetAttribute(kda_state_kernel<VB>, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem));
  if (e == cudaSuccess && kStage)
    e = cudaFuncSetAttribute(kda_state_kernel<VB>, cudaFuncAttributePreferredSharedMemoryCarveout,
                             int(cudaSharedmemCarveoutMaxShared));
  if (e != cudaSuccess) return e;
  kda_state_kernel<VB><<<dim3(128 / VB, unsigned(p.n_head), unsigned(p.n_seq)), NT, smem, st>>>(p, ws, c0, c1);
  return cudaGetLastError();
}

}  // namespace
}  // namespace kdapre

size_t kda_prefill_fast_workspace_bytes(int n_head) { return size_t(n_head) * kdapre::CHUNK_BYTES; }

namespace {
// The pre-pass of the next window runs on a side stream while the state walk of this one runs (the walk is
// latency-bound and leaves the SMs room): one side stream and four events per device, made on first use.
struct Side {
  cudaStream_t s = nullptr;
  cudaEvent_t entry = nullptr, intra[2] = {}, state[2] = {};
};
Status side_of(Side*& out) {
  static std::mutex mu;
  static Side sides[64];
  int dev = 0;
  K3_CUDA_CHECK(cudaGetDevice(&dev));
  if (dev < 0 || dev >= 64) return error(Code::internal, "kda_prefill_fast: device " + std::to_string(dev));
  std::lock_guard<std::mutex> lock(mu);
  Side& sd = sides[dev];
  if (!sd.s) {
    K3_CUDA_CHECK(cudaStreamCreateWithFlags(&sd.s, cudaStreamNonBlocking));
    for (cudaEvent_t* e : {&sd.entry, &sd.intra[0], &sd.intra[1], &sd.state[0], &sd.state[1]})
      K3_CUDA_CHECK(cudaEventCreateWithFlags(e, cudaEventDisableTiming));
  }
  out = &sd;
  return ok_status();
}
}  // namespace

Status kda_prefill_fast_cuda_onekernel(const KdaPrefillParams& p, GpuContext& g);  // kda_fast_prefill.cu

// The two-kernel prefill is the default since session 4 (checked against fp64 and timed on the H200: 1.5x
// the one-kernel version at T = 2048, 8192 and 8 x 1024); K3_KDA_PREFILL_SPLIT=0 runs the one-kernel one.
bool kda_prefill_split_enabled() {
  static const bool on = env_switch("K3_KDA_PREFILL_SPLIT", true);
  return on;
}

Status kda_prefill_fast_cuda(const KdaPrefillParams& p, GpuContext& g) {
  using namespace kdapre;
  if (!kda_prefill_split_enabled()) return kda_prefill_fast_cuda_onekernel(p, g);
  Status st = kda_prefill_fast_check(p);
  if (!st.ok()) return st;
  if (p.n_tok == 0) return ok_status();
  const size_t per_chunk = size_t(p.n_head) * CHUNK_BYTES;
  if (!g.workspace || g.workspace_bytes < per_chunk)
    return error(Code::invalid_argument, "kda_prefill_fast: the GPU workspace (" + std::to_string(g.workspace_bytes) +
                                             " bytes) holds no chunk of n_head=" + std::to_string(p.n_head) +
                                             " (needs " + std::to_string(per_chunk) + " bytes)");
  static const bool vb64 = env_value("K3_KDA_PRE_VB") == "64";  // bench only: 64 value columns per state CTA
  auto state = vb64 ? launch_state<64> : launch_state<32>;
  const int64_t max_chunks = p.n_tok / C + p.n_seq;  // >= sum of ceil(len / 64); the kernels skip the rest
  const int64_t fit = int64_t(g.workspace_bytes / per_chunk);
  uint32_t* ws = static_cast<uint32_t*>(g.workspace);
  // Pre-pass and walk in turn on one stream: measured faster on the H200 than overlapping them on two
  // streams (3.45 vs 3.58 ms at T = 8192, 54.7 vs 56.5 ms at 131072); K3_KDA_PRE_OVERLAP=1 overlaps.
  static const bool overlap = env_switch("K3_KDA_PRE_OVERLAP", false);
  if (!overlap || fit < 2 || max_chunks <= fit) {  // one buffer: pre-pass, walk, pre-pass, walk, ...
    const int64_t window = std::min(max_chunks, fit);
    for (int64_t c0 = 0; c0 < max_chunks; c0 += window) {
      const int64_t c1 = std::min(max_chunks, c0 + window);
      K3_CUDA_CHECK(launch_intra(p, ws, c0, int(c1 - c0), g.stream));
      K3_CUDA_CHECK(state(p, ws, c0, c1, g.stream));
    }
    return ok_status();
  }
  // Two buffers: window w's walk (g.stream) overlaps window w+1's pre-pass (side stream).
  Side* sd = nullptr;
  K3_RETURN_IF_ERROR(side_of(sd));
  const int64_t window = fit / 2, n_win = (max_chunks + window - 1) / window;
  uint32_t* buf[2] = {ws, ws + size_t(window) * per_chunk / 4};
  auto intra = [&](int64_t w) -> Status {
    const int b = int(w & 1);
    if (w >= 2) K3_CUDA_CHECK(cudaStreamWaitEvent(sd->s, sd->state[b], 0));  // walk w-2 is done with buf[b]
    const int64_t c0 = w * window;
    K3_CUDA_CHECK(launch_intra(p, buf[b], c0, int(std::min(window, max_chunks - c0)), sd->s));
    K3_CUDA_CHECK(cudaEventRecord(sd->intra[b], sd->s));
    return ok_status();
  };
  K3_CUDA_CHECK(cudaEventRecord(sd->entry, g.stream));  // inputs ready, earlier users of the workspace done
  K3_CUDA_CHECK(cudaStreamWaitEvent(sd->s, sd->entry, 0));
  K3_RETURN_IF_ERROR(intra(0));
  for (int64_t w = 0; w < n_win; ++w) {
    const int b = int(w & 1);
    const int64_t c0 = w * window;
    K3_CUDA_CHECK(cudaStreamWaitEvent(g.stream, sd->intra[b], 0));
    K3_CUDA_CHECK(state(p, buf[b], c0, std::min(max_chunks, c0 + window), g.stream));
    K3_CUDA_CHECK(cudaEventRecord(sd->state[b], g.stream));
    if (w + 1 < n_win) K3_RETURN_IF_ERROR(intra(w + 1));
  }
  return ok_status();  // every side-stream launch is followed by a walk on g.stream that waits for it
}

}  // namespace k3
