// mla_prefill_cuda.cu: dense causal MLA prefill attention on mma.sync bf16 tensor cores (contract:
// mla_prefill.h).
//
// CTA = 128 queries of one head, 8 warps; warp w owns query rows 16 w .. 16 w + 15 (Q's A fragments in
// registers, loaded once from global memory). Key tiles of 64: K (64 x 192) and V (64 x 128) double-buffered
// in padded shared memory by cp.async. Per tile and warp:
//   S (16 x 64) = Q K^T: 12 k-steps x 8 n-tiles of m16n8k16, K fragments by ldmatrix;
//   causal mask on the diagonal tiles; online softmax in registers (a quad of lanes owns 2 rows);
//   O (16 x 128) += P V: P's A fragments are S's accumulators rounded to bf16, V fragments by
//   ldmatrix.trans; 64 fp32 accumulators a thread.
// Grid (query blocks, heads), the longest (last) query blocks first. Shared memory 85 KiB, ~230 registers a
// thread (Q 48, O 64, S 32 + P 16): one CTA per SM.
#include <cuda_bf16.h>

#include <cmath>

#include "ops/cuda_mma.cuh"
#include "ops/cuda_util.cuh"
#include "ops/mla_prefill.h"

namespace k3 {
namespace {

constexpr int kQ = 128, kKv = 64, kThreads = 256;
constexpr int kQkSteps = kMlaPrefillQk / 16;  // 12
constexpr int kKStride = kMlaPrefillQk + 8;   // 400-byte rows: ldmatrix rows on distinct banks
constexpr int kVStride = kMlaPrefillV + 8;    // 272-byte rows
constexpr int kKChunks = kMlaPrefillQk / 8, kVChunks = kMlaPrefillV / 8;  // 16-byte chunks a row: 24, 16
constexpr int kStage = kKv * (kKStride + kVStride);                       // bf16 elements of one K + V stage
constexpr size_t kSmem = size_t(2) * kStage * 2;

// cp.async of key tile [k0, k0 + 64) of head h into one stage (rows >= n_end zero-filled).
__device__ __forceinline__ void load_kv(const MlaPrefillParams& p, int h, int k0, int n_end,
                                        uint16_t* stage) {
  uint16_t* ks = stage;
  uint16_t* vs = stage + kKv * kKStride;
  for (int c = threadIdx.x; c < kKv * kKChunks; c += kThreads) {
    const int r = c / kKChunks, part = c % kKChunks, s = k0 + r;
    uint16_t* dst = ks + r * kKStride + part * 8;
    if (s >= n_end) {
      *reinterpret_cast<uint4*>(dst) = make_uint4(0, 0, 0, 0);
    } else if (part < kMlaPrefillNope / 8) {
      cp_async16(smem_addr(dst), p.k_nope + s * p.k_tok_stride + h * p.k_head_stride + part * 8);
    } else {
      cp_async16(smem_addr(dst), p.k_rope + s * p.r_tok_stride + h * p.r_head_stride + (part - 16) * 8);
    }
  }
  for (int c = threadIdx.x; c < kKv * kVChunks; c += kThreads) {
    const int r = c / kVChunks, part = c % kVChunks, s = k0 + r;
    uint16_t* dst = vs + r * kVStride + part * 8;
    if (s >= n_end)
      *reinterpret_cast<uint4*>(dst) = make_uint4(0, 0, 0, 0);
    else
      cp_async16(smem_addr(dst), p.v + s * p.v_tok_stride + h * p.v_head_stride + part * 8);
  }
  asm volatile("cp.async.commit_group;\n");
}

__global__ void __launch_bounds__(kThreads, 1) mla_prefill_kernel(MlaPrefillParams p) {
  extern __shared__ __align__(16) uint16_t smem[];
  const int h = blockIdx.y, q0 = (gridDim.x - 1 - blockIdx.x) * kQ;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, qd = lane % 4;
  const int n_rows = min(kQ, p.n_q - q0);
  const int n_end = p.q_pos0 + q0 + n_rows;  // keys < n_end are seen by some row
  const int n_tiles = (n_end + kKv - 1) / kKv;
  const int pos_r0 = p.q_pos0 + q0 + warp * 16 + g;  // position of this thread's rows r0, r0 + 8
  const int warp_max_pos = p.q_pos0 + q0 + warp * 16 + 15;

  load_kv(p, h, 0, n_end, smem);
  uint32_t qf[kQkSteps][4];  // A fragments of Q rows (16 warp + g, + 8), zero past n_q
  {
    const int t0 = q0 + warp * 16 + g, t1 = t0 + 8;
    const uint16_t* q_0 = p.q + int64_t(t0) * p.q_tok_stride + h * p.q_head_stride;
    const uint16_t* q_1 = p.q + int64_t(t1) * p.q_tok_stride + h * p.q_head_stride;
#pragma unroll
    for (int kk = 0; kk < kQkSteps; ++kk) {
      const int c = kk * 16 + qd * 2;
      qf[kk][0] = t0 < p.n_q ? *reinterpret_cast<const uint32_t*>(q_0 + c) : 0u;
      qf[kk][1] = t1 < p.n_q ? *reinterpret_cast<const uint32_t*>(q_1 + c) : 0u;
      qf[kk][2] = t0 < p.n_q ? *reinterpret_cast<const uint32_t*>(q_0 + c + 8) : 0u;
      qf[kk][3] = t1 < p.n_q ? *reinterpret_cast<const uint32_t*>(q_1 + c + 8) : 0u;
    }
  }
  float o[16][4];
#pragma unroll
  for (int j = 0; j < 16; ++j) o[j][0] = o[j][1] = o[j][2] = o[j][3] = 0.f;
  float m0 = -INFINITY, m1 = -INFINITY, l0 = 0.f, l1 = 0.f;  // log2 units; l: this thread's columns
  const float scale_log2 = p.scale * 1.4426950408889634f;

  for (int it = 0; it < n_tiles; ++it) {
    const int k0 = it * kKv;
    const uint16_t* ks = smem + (it % 2) * kStage;
    const uint16_t* vs = ks + kKv * kKStride;
    if (it + 1 < n_tiles) {
      load_kv(p, h, k0 + kKv, n_end, smem + ((it + 1) % 2) * kStage);
      asm volatile("cp.async.wait_group 1;\n");
    } else {
      asm volatile("cp.async.wait_group 0;\n");
    }
    __syncthreads();
    if (k0 <= warp_max_pos) {  // else every key of the tile is after every row of this warp
      float s[8][4];
#pragma unroll
      for (int j = 0; j < 8; ++j) s[j][0] = s[j][1] = s[j][2] = s[j][3] = 0.f;
      const uint32_t ka = smem_addr(ks + ((lane & 7) + ((lane >> 4) << 3)) * kKStride + ((lane >> 3) & 1) * 8);
#pragma unroll
      for (int kk = 0; kk < kQkSteps; ++kk)
#pragma unroll
        for (int jp = 0; jp < 4; ++jp) {
          uint32_t bb[4];
          ldsm_x4(ka + (jp * 16 * kKStride + kk * 16) * 2, bb);
          mma_bf16(s[2 * jp], qf[kk], bb[0], bb[1]);
          mma_bf16(s[2 * jp + 1], qf[kk], bb[2], bb[3]);
        }
      const bool diag = k0 + kKv - 1 > pos_r0 - g;  // some key of the tile is after the warp's first row
      float mx0 = -INFINITY, mx1 = -INFINITY;
#pragma unroll
      for (int j = 0; j < 8; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int key = k0 + 8 * j + 2 * qd + (e & 1), pos = pos_r0 + 8 * (e >> 1);
          const float v = diag && key > pos ? -INFINITY : s[j][e] * scale_log2;
          s[j][e] = v;
          if (e < 2)
            mx0 = fmaxf(mx0, v);
          else
            mx1 = fmaxf(mx1, v);
        }
#pragma unroll
      for (int d = 1; d < 4; d <<= 1) {
        mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, d));
        mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, d));
      }
      // key 0 is seen by every row, so m is finite from tile 0 on; a row with no key in this tile keeps m
      const float mn0 = fmaxf(m0, mx0), mn1 = fmaxf(m1, mx1);
      const float a0 = exp2f(m0 - mn0), a1 = exp2f(m1 - mn1);
      m0 = mn0, m1 = mn1;
      uint32_t pf[4][4];  // A fragments of P for the 4 k-steps of P V
      float sum0 = 0.f, sum1 = 0.f;
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        const __nv_bfloat162 x0 = __floats2bfloat162_rn(exp2f(s[j][0] - mn0), exp2f(s[j][1] - mn0));
        const __nv_bfloat162 x1 = __floats2bfloat162_rn(exp2f(s[j][2] - mn1), exp2f(s[j][3] - mn1));
        const float2 f0 = __bfloat1622float2(x0), f1 = __bfloat1622float2(x1);
        sum0 += f0.x + f0.y, sum1 += f1.x + f1.y;
        pf[j / 2][(j % 2) * 2] = *reinterpret_cast<const uint32_t*>(&x0);
        pf[j / 2][(j % 2) * 2 + 1] = *reinterpret_cast<const uint32_t*>(&x1);
      }
      l0 = l0 * a0 + sum0, l1 = l1 * a1 + sum1;
#pragma unroll
      for (int j = 0; j < 16; ++j) o[j][0] *= a0, o[j][1] *= a0, o[j][2] *= a1, o[j][3] *= a1;
      const uint32_t va = smem_addr(vs + ((lane & 7) + ((lane >> 3) & 1) * 8) * kVStride + (lane >> 4) * 8);
#pragma unroll
      for (int kk = 0; kk < kKv / 16; ++kk)
#pragma unroll
        for (int jp = 0; jp < 8; ++jp) {
          uint32_t bb[4];
          ldsm_x4_trans(va + (kk * 16 * kVStride + jp * 16) * 2, bb);
          mma_bf16(o[2 * jp], pf[kk], bb[0], bb[1]);
          mma_bf16(o[2 * jp + 1], pf[kk], bb[2], bb[3]);
        }
    }
    __syncthreads();  // this stage is reloaded next iteration
  }
#pragma unroll
  for (int d = 1; d < 4; d <<= 1) {
    l0 += __shfl_xor_sync(0xffffffffu, l0, d);
    l1 += __shfl_xor_sync(0xffffffffu, l1, d);
  }
  const int t0 = q0 + warp * 16 + g;
#pragma unroll
  for (int e2 = 0; e2 < 2; ++e2) {
    const int t = t0 + 8 * e2;
    if (t >= p.n_q) continue;
    const float r = 1.f / (e2 ? l1 : l0);
    float* dst = p.out + (int64_t(t) * p.n_head + h) * kMlaPrefillV + 2 * qd;
#pragma unroll
    for (int j = 0; j < 16; ++j)
      *reinterpret_cast<float2*>(dst + 8 * j) = make_float2(o[j][2 * e2] * r, o[j][2 * e2 + 1] * r);
  }
}

}  // namespace

void mla_prefill_cuda(const MlaPrefillParams& p, GpuContext& g) {
  K3_ASSERT(mla_prefill_check(p).ok());
  static const bool attr = [] {
    K3_CUDA_ASSERT(
        cudaFuncSetAttribute(mla_prefill_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(kSmem)));
    return true;
  }();
  (void)attr;
  const dim3 grid((p.n_q + kQ - 1) / kQ, p.n_head);
  mla_prefill_kernel<<<grid, kThreads, kSmem, g.stream>>>(p);
  K3_CUDA_LAUNCH_CHECK();
}

}  // namespace k3
