// kda_fast_decode_tma.cu: the second version of the fused KDA decode step (kda_fast.h), d_k = d_v = 128.
// Checked against the fp64 reference and timed on the H200 in session 4 (b = 64: 0.86 of the copy rate). It
// runs from 8 sequences on (kda_fast_decode.cu's dispatch), when a caller sets one of KdaDecodeParams'
// optional fields (the GPU model's fast path, K3_KDA_FAST=1), or with K3_KDA_DECODE_TMA=1.
//
// One CTA (8 warps) per (head, sequence); the state S[slot][h] [128, 128] fp32 (64 KB, contiguous) is read
// once, updated and written back once, in place:
//   conv window + current pre-conv input -> SiLU -> bf16;  q, k l2norm (q * K^-1/2);  alpha = exp(g),
//   g = g_lower sigmoid(exp(A_log) (f + dt_bias))  (KL: -exp(A_log) softplus(f + dt_bias));  beta =
//   sigmoid(b) S <- diag(alpha) S;  u = beta (v - S^T k);  S <- S + k u^T;  o = bf16(S^T q) out = o
//   rsqrt(mean(o^2) + eps) w_onorm sigmoid(gate)
// Thread (warp w, lane l) owns rows 16w .. 16w+15, columns 4l .. 4l+3; sums over the 128 rows go through
// shared memory, one partial per warp. Every small input (f, b, gate, weights) is loaded at the start.
//
// Two ways to hold the state (KDA_DECODE_TMA, default 1):
//   1: one bulk copy (cp.async.bulk, the TMA unit) of the 64 KB into shared memory, issued by thread 0 first;
//      both passes read shared memory, the updated state goes back by a bulk store. Few registers, so three
//      CTAs per SM keep 3 x 64 KB in flight, and the store does not hold the CTA's registers.
//   0: 16 float4 registers per thread (2 CTAs per SM).
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>

#include "core/cuda_check.h"
#include "ops/cuda_mma.cuh"
#include "ops/kda_fast.h"
#include "ops/kda_fast_decode_io.cuh"

namespace k3 {
namespace {

#ifndef KDA_DECODE_TMA
#define KDA_DECODE_TMA 1
#endif
#ifndef KDA_DECODE_CTAS  // CTAs per SM the TMA version is sized for (3 x 74 KB of shared memory)
#define KDA_DECODE_CTAS 3
#endif
constexpr int DK = 128, DV = 128, NT = 256, NW = NT / 32, ROWS = DK / NW;
[[maybe_unused]] constexpr unsigned kStateBytes = DK * DV * 4;  // unused with KDA_DECODE_TMA=0

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
__device__ inline float sigm(float x) {
  return 1.f / (1.f + __expf(-x));
}
__device__ inline void fma4(float4& acc, const float4& s, float w) {
  acc.x += s.x * w, acc.y += s.y * w, acc.z += s.z * w, acc.w += s.w * w;
}

struct Smem {
  float x[3][DK];        // conv outputs q~, k~, v~ (bf16 values)
  float alpha[DK];       // exp(g)
  float red[2][NW][DV];  // per-warp partial sums: S^T k, then S^T q
  float scal[4];         // |q|^-1 K^-1/2, |k|^-1, beta
  unsigned long long bar;
};

// After the conv: alpha = exp(g), the two norms and beta into sm; ends with the block synchronized.
__device__ inline void prologue_tail(const KdaDecodeParams& p, Smem& sm, int h, int b, float A, float fz,
                                     float bl) {
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, H = p.n_head, HK = H * DK;
  if (tid < DK) {
    const float g = p.softplus_gate ? -A * (fz > 20.f ? fz : log1pf(expf(fz))) : p.g_lower * sigm(A * fz);
    sm.alpha[tid] = __expf(g);
    if (p.g_out) p.g_out[size_t(b) * HK + h * DK + tid] = g;
  }
  __syncthreads();
  if (warp < 2) {  // warp 0: |q|, warp 1: |k|
    float ss = 0.f;
#pragma unroll
    for (int j = 0; j < 4; ++j) ss += sm.x[warp][lane + 32 * j] * sm.x[warp][lane + 32 * j];
    ss = warp_sum(ss);
    if (lane == 0) sm.scal[warp] = rsqrtf(ss + 1e-6f) * (warp == 0 ? rsqrtf(float(DK)) : 1.f);
  } else if (tid == 64) {
    sm.scal[2] = 1.f / (1.f + __expf(-bl));
  }
  __syncthreads();
  if (p.q_out && tid < DK) {  // the traced intermediates (tests, traces)
    const size_t r = size_t(b) * HK + h * DK + tid;
    p.q_out[r] = sm.x[0][tid] * sm.scal[0], p.k_out[r] = sm.x[1][tid] * sm.scal[1], p.v_out[r] = sm.x[2][tid];
    if (tid == 0) p.beta_out[size_t(b) * H + h] = sm.scal[2];
  }
}

// conv output of one channel (width 4 over [x_{t-3}, x_{t-2}, x_{t-1}] and x_t), SiLU, bf16
__device__ inline float conv_silu(const float4& w, uint16_t w0, uint16_t w1, uint16_t w2, uint16_t cur) {
  const float y = w.x * bf16f(w0) + w.y * bf16f(w1) + w.z * bf16f(w2) + w.w * bf16f(cur);
  return round_bf16(y * sigm(y));
}

__device__ inline const float* conv_taps(const KdaDecodeParams& p, int m) {
  return m == 0 || !p.conv_w_k ? p.conv_w + size_t(m) * p.n_head * DK * 4
                               : (m == 1 ? p.conv_w_k : p.conv_w_v);
}

// Everything before the state is touched: conv + SiLU + roll of the window, gate, beta, the two norms.
// Ends with the block synchronized; returns (gate, o_norm) of column tid (tid < DV).
__device__ inline float2 prologue(const KdaDecodeParams& p, Smem& sm, int h, int b, uint16_t* conv) {
  const int tid = threadIdx.x, H = p.n_head, HK = H * DK;
  float2 go = make_float2(0.f, 0.f);
  float fz = 0.f, A = 0.f, bl = 0.f;
  if (tid < DV) {
    go.x = kda_io::gate(p, b, h * DV + tid);
    go.y = p.o_norm[tid];
    fz = kda_io::f(p, b, h * DK + tid) + p.dt_bias[h * DK + tid];
    A = __expf(p.A_log[h]);
    if (tid == 64) bl = kda_io::beta_logit(p, b, h);
  }
  for (int e = tid; e < 3 * DK; e += NT) {
    const int m = e / DK, c = e % DK, ch = h * DK + c;
    const float4 w = reinterpret_cast<const float4*>(conv_taps(p, m))[ch];
    uint16_t* win = conv + size_t(m) * 3 * HK + ch;
    const uint16_t cur = kda_io::qkv(p, b, m, ch);
    const uint16_t w0 = win[0], w1 = win[HK], w2 = win[2 * HK];
    sm.x[m][c] = conv_silu(w, w0, w1, w2, cur);
    win[0] = w1, win[HK] = w2, win[2 * HK] = cur;  // only this CTA touches these channels
  }
  prologue_tail(p, sm, h, b, A, fz, bl);
  return go;
}

// The persistent kernel's inputs of one (head, sequence) step in registers, loaded during the previous step.
constexpr int NE = (3 * DK + NT - 1) / NT;  // conv items per thread: e = tid, tid + NT (e < 3 * DK)
struct StepIn {
  float2 go;  // (gate, o_norm) of column tid (tid < DV)
  float fz, A, bl;
  float4 w[NE];  // conv taps
  uint16_t win[NE][3], cur[NE];
};

[[maybe_unused]] __device__ inline void load_inputs(const KdaDecodeParams& p, int h, int b,
                                                    const uint16_t* conv, StepIn& in) {
  const int tid = threadIdx.x, H = p.n_head, HK = H * DK;
  in.go = make_float2(0.f, 0.f), in.fz = in.A = in.bl = 0.f;
  if (tid < DV) {
    in.go.x = kda_io::gate(p, b, h * DV + tid);
    in.go.y = p.o_norm[tid];
    in.fz = kda_io::f(p, b, h * DK + tid) + p.dt_bias[h * DK + tid];
    in.A = __expf(p.A_log[h]);
    if (tid == 64) in.bl = kda_io::beta_logit(p, b, h);
  }
#pragma unroll
  for (int r = 0; r < NE; ++r) {
    const int e = tid + NT * r, m = e / DK, ch = h * DK + e % DK;
    if (e >= 3 * DK) break;
    in.w[r] = reinterpret_cast<const float4*>(conv_taps(p, m))[ch];
    const uint16_t* win = conv + size_t(m) * 3 * HK + ch;
    in.win[r][0] = win[0], in.win[r][1] = win[HK], in.win[r][2] = win[2 * HK];
    in.cur[r] = kda_io::qkv(p, b, m, ch);
  }
}

// prologue() from inputs already in registers
[[maybe_unused]] __device__ inline float2 prologue_from(const KdaDecodeParams& p, Smem& sm, int h, int b,
                                                        uint16_t* conv, const StepIn& in) {
  const int tid = threadIdx.x, HK = p.n_head * DK;
#pragma unroll
  for (int r = 0; r < NE; ++r) {
    const int e = tid + NT * r, m = e / DK, c = e % DK;
    if (e >= 3 * DK) break;
    sm.x[m][c] = conv_silu(in.w[r], in.win[r][0], in.win[r][1], in.win[r][2], in.cur[r]);
    uint16_t* win = conv + size_t(m) * 3 * HK + h * DK + c;
    win[0] = in.win[r][1], win[HK] = in.win[r][2], win[2 * HK] = in.cur[r];
  }
  prologue_tail(p, sm, h, b, in.A, in.fz, in.bl);
  return in.go;
}

// o = bf16(sum of the per-warp partials in red[1]); the gated RMSNorm over the head's 128 values.
__device__ inline void epilogue(const KdaDecodeParams& p, Smem& sm, int h, int b, float2 go) {
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, H = p.n_head;
  float o = 0.f;
  if (tid < DV) {
#pragma unroll
    for (int w = 0; w < NW; ++w) o += sm.red[1][w][tid];
    o = round_bf16(o);
    const float ss = warp_sum(o * o);
    if (lane == 0) sm.red[0][0][warp] = ss;
  }
  __syncthreads();
  if (tid < DV) {
    const float ms = (sm.red[0][0][0] + sm.red[0][0][1] + sm.red[0][0][2] + sm.red[0][0][3]) / float(DV);
    const float y = o * rsqrtf(ms + p.eps) * go.y * sigm(go.x);
    kda_io::store_out(p, b, h * DV + tid, y);
    if (p.o_out) p.o_out[size_t(b) * H * DV + h * DV + tid] = o;
  }
}

__device__ inline float* state_of(const KdaDecodeParams& p, int h, int b) {
  return kda_io::state(p, b) + size_t(h) * DK * DV;
}
__device__ inline uint16_t* conv_of(const KdaDecodeParams& p, int b) {
  return kda_io::window(p, b);
}

// u = beta (v - S^T k) from the per-warp partials in red[0] (after a barrier), columns 4 lane .. + 3.
__device__ inline float4 delta(const Smem& sm, float beta, int lane) {
  float4 u = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll
  for (int w = 0; w < NW; ++w) {
    const float4 r = reinterpret_cast<const float4*>(sm.red[0][w])[lane];
    u.x += r.x, u.y += r.y, u.z += r.z, u.w += r.w;
  }
  const float4 v = reinterpret_cast<const float4*>(sm.x[2])[lane];
  return make_float4(beta * (v.x - u.x), beta * (v.y - u.y), beta * (v.z - u.z), beta * (v.w - u.w));
}

#if KDA_DECODE_TMA
// The update of the state Ss [DK][DV / 4] in shared memory, in place:
//   pass 1: u = beta (v - (diag(alpha) S)^T k);
//   pass 2: S <- diag(alpha) S + k u^T, the o partials into sm.red[1].
// Ends synchronized, the new state visible to a bulk store.
__device__ inline void update_state(Smem& sm, float4* Ss, float sq, float sk, float beta) {
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  float4 part = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll
  for (int i = 0; i < ROWS; ++i) {  // pass 1: u partial = (diag(alpha) S)^T k over this warp's rows
    const int a = warp * ROWS + i;
    fma4(part, Ss[a * (DV / 4) + lane], sm.alpha[a] * sm.x[1][a] * sk);
  }
  reinterpret_cast<float4*>(sm.red[0][warp])[lane] = part;
  __syncthreads();
  const float4 u = delta(sm, beta, lane);
  part = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll
  for (int i = 0; i < ROWS; ++i) {  // pass 2: S <- diag(alpha) S + k u^T; o partial = S^T q
    const int a = warp * ROWS + i;
    const float al = sm.alpha[a], ka = sm.x[1][a] * sk;
    float4 s = Ss[a * (DV / 4) + lane];
    s = make_float4(al * s.x + ka * u.x, al * s.y + ka * u.y, al * s.z + ka * u.z, al * s.w + ka * u.w);
    fma4(part, s, sm.x[0][a] * sq);
    Ss[a * (DV / 4) + lane] = s;
  }
  reinterpret_cast<float4*>(sm.red[1][warp])[lane] = part;
  fence_proxy_async();  // the new state, visible to the bulk store
  __syncthreads();
}

// The 64 KB state Sg -> dst as 4 bulk copies of 16 KB completing on mbarrier bar (thread 0).
__device__ inline void bulk_load_state(const float* Sg, float4* dst, uint32_t bar) {
  mbar_expect_tx(bar, kStateBytes);
#pragma unroll
  for (int i = 0; i < 4; ++i)
    bulk_g2s(smem_addr(dst) + i * (kStateBytes / 4),
             reinterpret_cast<const char*>(Sg) + i * (kStateBytes / 4), kStateBytes / 4, bar);
}

__global__ void __launch_bounds__(NT, KDA_DECODE_CTAS) kda_decode_kernel(const KdaDecodeParams p) {
  extern __shared__ __align__(128) float4 Ss[];  // [DK][DV / 4] the state
  __shared__ Smem sm;
  const int h = blockIdx.x, b = blockIdx.y, tid = threadIdx.x;
  float* Sg = state_of(p, h, b);
  const uint32_t bar = smem_addr(&sm.bar);
  if (tid == 0) {  // the state load first: 4 bulk copies of 16 KB completing on one mbarrier
    mbar_init(bar, 1);
    fence_mbar_init();
    fence_proxy_async();
    bulk_load_state(Sg, Ss, bar);
  }
  const float2 go = prologue(p, sm, h, b, conv_of(p, b));  // (its barriers publish the mbarrier init)
  const float sq = sm.scal[0], sk = sm.scal[1], beta = sm.scal[2];
  mbar_wait_parity(bar, 0);
  update_state(sm, Ss, sq, sk, beta);
  if (tid == 0) {
    asm volatile(
        "cp.async.bulk.global.shared::cta.bulk_group [%0], [%1], %2;\n\tcp.async.bulk.commit_group;" ::"l"(
            Sg),
        "r"(smem_addr(Ss)), "r"(kStateBytes)
        : "memory");
  }
  epilogue(p, sm, h, b, go);
  if (tid == 0) asm volatile("cp.async.bulk.wait_group.read 0;" ::: "memory");  // Ss read before exit
}

// Persistent version (session 5): one CTA per SM walks the (head, sequence) items gridDim.x apart with a
// ring of kRing state buffers in shared memory. While it updates item k, the bulk loads of items k + 1 to
// k + kRing - 1 are in flight and item k - 1's bulk store drains, so an SM always has 2 x 64 KB of loads
// and one store in flight, and there is no tail of a last partial wave of CTAs. Buffer k % kRing's mbarrier
// completes once per use (parity (k / kRing) & 1); a buffer is refilled only after the bulk store that read
// it (wait_group.read). The next item's inputs are loaded into registers during the current item. Measured
// on the H200 (session 5): correct, 0.756 of the copy rate at b = 64 against 0.86 for the bulk-copy kernel
// (each item's state wait, passes and barriers on one CTA per SM stay exposed). Opt-in only
// (K3_KDA_DECODE_TMA=2).
constexpr int kRing = 3;

__global__ void __launch_bounds__(NT, 1) kda_decode_ring_kernel(const KdaDecodeParams p) {
  extern __shared__ __align__(128) float4 ring[];  // [kRing][DK][DV / 4]
  __shared__ Smem sm;
  __shared__ unsigned long long bars[kRing];
  const int tid = threadIdx.x, H = p.n_head;
  const int n_items = H * p.n_seq;
  auto item = [&](int k) { return int(blockIdx.x) + k * int(gridDim.x); };  // item i: head i % H, seq i / H
  auto buf = [&](int k) { return ring + size_t(k % kRing) * (DK * DV / 4); };
  if (tid == 0) {
    for (int r = 0; r < kRing; ++r) mbar_init(smem_addr(&bars[r]), 1);
    fence_mbar_init();
    fence_proxy_async();
    for (int k = 0; k < kRing - 1; ++k)
      if (item(k) < n_items)
        bulk_load_state(state_of(p, item(k) % H, item(k) / H), buf(k), smem_addr(&bars[k % kRing]));
  }
  __syncthreads();
  StepIn in;  // this item's inputs; the next item's are loaded during this one
  if (item(0) < n_items) load_inputs(p, item(0) % H, item(0) / H, conv_of(p, item(0) / H), in);
  for (int k = 0; item(k) < n_items; ++k) {
    const int i = item(k), h = i % H, b = i / H;
    float4* Ss = buf(k);
    float* Sg = state_of(p, h, b);
    StepIn next;
    const int j = item(k + 1);
    if (j < n_items) load_inputs(p, j % H, j / H, conv_of(p, j / H), next);
    if (tid == 0 &&
        item(k + kRing - 1) < n_items) {  // refill the buffer item k - 1 used, once its store read it
      asm volatile("cp.async.bulk.wait_group.read 0;" ::: "memory");
      const int j = item(k + kRing - 1);
      bulk_load_state(state_of(p, j % H, j / H), buf(k + kRing - 1),
                      smem_addr(&bars[(k + kRing - 1) % kRing]));
    }
    const float2 go = prologue_from(p, sm, h, b, conv_of(p, b), in);
    const float sq = sm.scal[0], sk = sm.scal[1], beta = sm.scal[2];
    const uint32_t bar = smem_addr(&bars[k % kRing]), parity = uint32_t(k / kRing) & 1u;
    mbar_wait_parity(bar, parity);
    update_state(sm, Ss, sq, sk, beta);
    if (tid == 0)
      asm volatile(
          "cp.async.bulk.global.shared::cta.bulk_group [%0], [%1], %2;\n\tcp.async.bulk.commit_group;" ::"l"(
              Sg),
          "r"(smem_addr(Ss)), "r"(kStateBytes)
          : "memory");
    epilogue(p, sm, h, b, go);
    __syncthreads();  // sm is the next item's
    in = next;
  }
  if (tid == 0) asm volatile("cp.async.bulk.wait_group.read 0;" ::: "memory");
}

#else
__global__ void __launch_bounds__(NT, 2) kda_decode_kernel(const KdaDecodeParams p) {
  __shared__ Smem sm;
  const int h = blockIdx.x, b = blockIdx.y, warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  float4* Sg = reinterpret_cast<float4*>(state_of(p, h, b));
  float4 s[ROWS];
#pragma unroll
  for (int i = 0; i < ROWS; ++i) s[i] = Sg[(warp * ROWS + i) * (DV / 4) + lane];
  const float2 go = prologue(p, sm, h, b, conv_of(p, b));
  const float sq = sm.scal[0], sk = sm.scal[1], beta = sm.scal[2];
  float4 part = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll
  for (int i = 0; i < ROWS; ++i) {
    const int a = warp * ROWS + i;
    const float al = sm.alpha[a];
    s[i].x *= al, s[i].y *= al, s[i].z *= al, s[i].w *= al;
    fma4(part, s[i], sm.x[1][a] * sk);
  }
  reinterpret_cast<float4*>(sm.red[0][warp])[lane] = part;
  __syncthreads();
  const float4 u = delta(sm, beta, lane);
  part = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll
  for (int i = 0; i < ROWS; ++i) {
    const int a = warp * ROWS + i;
    const float ka = sm.x[1][a] * sk;
    s[i].x += ka * u.x, s[i].y += ka * u.y, s[i].z += ka * u.z, s[i].w += ka * u.w;
    fma4(part, s[i], sm.x[0][a] * sq);
    Sg[a * (DV / 4) + lane] = s[i];
  }
  reinterpret_cast<float4*>(sm.red[1][warp])[lane] = part;
  __syncthreads();
  epilogue(p, sm, h, b, go);
}
#endif

// Opts a kernel in to more than 48 KB of dynamic shared memory, once per device (a host-side attribute, not
// a stream operation; the first call is normally an eager one, before any graph capture).
template <class K>
Status opt_in_smem(K kernel, std::atomic<bool>* done, int bytes) {
  int dev = 0;
  K3_CUDA_CHECK(cudaGetDevice(&dev));
  if (dev >= 64 || !done[dev].load()) {
    K3_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes));
    if (dev < 64) done[dev] = true;
  }
  return ok_status();
}

}  // namespace

// Called by kda_decode_fast_cuda (kda_fast_decode.cu) after the shape check.
Status kda_decode_fast_tma_cuda(const KdaDecodeParams& p, GpuContext& g) {
  const dim3 grid(unsigned(p.n_head), unsigned(p.n_seq));
#if KDA_DECODE_TMA
  static std::atomic<bool> opted_in[64] = {};
  Status st = opt_in_smem(kda_decode_kernel, opted_in, int(kStateBytes));
  if (!st.ok()) return st;
  kda_decode_kernel<<<grid, NT, kStateBytes, g.stream>>>(p);
#else
  kda_decode_kernel<<<grid, NT, 0, g.stream>>>(p);
#endif
  K3_CUDA_CHECK(cudaGetLastError());
  return ok_status();
}

// The persistent version: min(items, SMs) CTAs of kRing x 64 KB of shared memory.
Status kda_decode_fast_ring_cuda(const KdaDecodeParams& p, GpuContext& g) {
#if KDA_DECODE_TMA
  static std::atomic<bool> opted_in[64] = {};
  Status st = opt_in_smem(kda_decode_ring_kernel, opted_in, int(kRing * kStateBytes));
  if (!st.ok()) return st;
  static std::atomic<int> n_sm[64] = {};
  int dev = 0, sms = 0;
  K3_CUDA_CHECK(cudaGetDevice(&dev));
  if (dev < 64) sms = n_sm[dev].load();
  if (sms == 0) {
    K3_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
    if (dev < 64) n_sm[dev] = sms;
  }
  const int items = p.n_head * p.n_seq;
  kda_decode_ring_kernel<<<unsigned(std::min(items, sms)), NT, kRing * kStateBytes, g.stream>>>(p);
  K3_CUDA_CHECK(cudaGetLastError());
  return ok_status();
#else
  return kda_decode_fast_tma_cuda(p, g);
#endif
}

}  // namespace k3
