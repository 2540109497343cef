// mla_decode_cuda.cu: absorbed MLA decode over the paged latent cache on the GPU (contract: mla_decode.h):
// the split plan, the CUDA-core kernel, the combine kernel and the dispatch.
//
// mla_decode_cuda picks the mma.sync kernel (mla_decode_mma_cuda.cu, 32 heads a CTA) for small steps and the
// heads-as-N Hopper warpgroup-MMA kernel (mla_decode_wgmma_hn_cuda.cu, 48 heads a CTA) for large ones
// (pick_kernel); the heads-as-M one (mla_decode_wgmma_cuda.cu, 64 heads a CTA) stays as a cross-check.
// mla_split_simple: 8 heads per CTA on CUDA cores (warp = head for the scores, thread = 2 dims
// for o), the slow cross-check.
#include <cuda_bf16.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <string>
#include <cstring>

#include "core/env.h"
#include "ops/cuda_util.cuh"
#include "ops/mla_decode_cuda.cuh"

namespace k3 {
namespace mla_detail {
namespace {

constexpr int kStride = kMlaRow + 8;
constexpr int kSimpleHeads = 8, kSimpleTile = 32, kSimpleThreads = 256;

Split choose_split(const MlaDecodeParams& p, int heads_per_cta, int want) {
  int n = want;
  if (n <= 0) {
    static int sms = [] {
      int dev = 0, v = 0;
      K3_CUDA_ASSERT(cudaGetDevice(&dev));
      K3_CUDA_ASSERT(cudaDeviceGetAttribute(&v, cudaDevAttrMultiProcessorCount, dev));
      return v;
    }();
    // fewest splits that fill every SM with whole waves (>= 85% of the last wave busy): fewer splits
    // mean fewer partials to write and combine (at batch 1 they rival the cache bytes)
    const int ctas = p.n_seq * ((p.n_head + heads_per_cta - 1) / heads_per_cta);
    const int n_max = (p.max_ctx + kTile - 1) / kTile;
    n = std::min(n_max, std::max(1, (sms + ctas - 1) / ctas));
    for (int c = n; c <= n_max; ++c) {
      const int64_t total = int64_t(ctas) * c, waves = (total + sms - 1) / sms;
      if (double(total) >= 0.85 * double(waves * sms)) {
        n = c;
        break;
      }
    }
  }
  n = std::min(n, (p.max_ctx + kTile - 1) / kTile);
  const int len = ((p.max_ctx + n - 1) / n + kTile - 1) / kTile * kTile;
  return {(p.max_ctx + len - 1) / len, len};
}

size_t partial_bytes(const MlaDecodeParams& p, int n_split) {
  return size_t(p.n_seq) * n_split * p.n_head * (kMlaLatent + 2) * sizeof(float);
}

}  // namespace

// Fits the partials into g.workspace (fewer, longer splits when it is small).
Split fit_split(const MlaDecodeParams& p, const GpuContext& g, int heads_per_cta) {
  K3_ASSERT(mla_decode_check(p).ok());
  Split s = choose_split(p, heads_per_cta, p.n_split);
  while (partial_bytes(p, s.n_split) > g.workspace_bytes && s.n_split > 1)
    s = choose_split(p, heads_per_cta, s.n_split / 2);
  K3_ASSERT(g.workspace && partial_bytes(p, s.n_split) <= g.workspace_bytes);
  return s;
}

namespace {

__global__ void __launch_bounds__(kSimpleThreads)
    mla_split_simple(MlaDecodeParams p, int n_split, int split_len, float* part_o, float* part_ml) {
  __shared__ __align__(16) uint16_t rows[kSimpleTile * kStride];
  __shared__ __align__(16) uint16_t q_s[kSimpleHeads * kMlaRow];
  __shared__ float p_s[kSimpleHeads][kSimpleTile], a_s[kSimpleHeads];
  const int b = blockIdx.z, split = blockIdx.y, h0 = blockIdx.x * kSimpleHeads;
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int n = p.ctx_len[b], t_begin = split * split_len, t_end = min(n, t_begin + split_len);
  for (int c = tid; c < kSimpleHeads * kChunks; c += kSimpleThreads) {
    const int r = c / kChunks, part = c % kChunks;
    uint4 v = make_uint4(0, 0, 0, 0);
    if (h0 + r < p.n_head)
      v = *reinterpret_cast<const uint4*>(p.q + (size_t(b) * p.n_head + h0 + r) * kMlaRow + part * 8);
    *reinterpret_cast<uint4*>(q_s + r * kMlaRow + part * 8) = v;
  }
  float m = -INFINITY, l = 0.f, acc[kSimpleHeads][2] = {};  // m, l: head h0 + warp (every lane)
  for (int t0 = t_begin; t0 < t_end; t0 += kSimpleTile) {
    __syncthreads();
    for (int c = tid; c < kSimpleTile * kChunks; c += kSimpleThreads) {
      const int tok = c / kChunks, part = c % kChunks;
      uint4 v = make_uint4(0, 0, 0, 0);
      if (t0 + tok < t_end) v = *reinterpret_cast<const uint4*>(row_ptr(p, b, t0 + tok) + part * 8);
      *reinterpret_cast<uint4*>(rows + tok * kStride + part * 8) = v;
    }
    __syncthreads();
    float s = 0.f;  // warp = head, lane = token
    for (int i = 0; i < kMlaRow; i += 2) {
      const float2 k =
          __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(rows + lane * kStride + i));
      const float2 q = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(q_s + warp * kMlaRow + i));
      s = fmaf(q.x, k.x, fmaf(q.y, k.y, s));
    }
    s = t0 + lane < t_end ? s * p.scale : -INFINITY;
    const float m_new = fmaxf(m, cuda_ops::warp_max(s));
    const float pr = __expf(s - m_new), alpha = __expf(m - m_new);
    l = l * alpha + cuda_ops::warp_sum(pr);
    m = m_new;
    p_s[warp][lane] = pr;
    if (lane == 0) a_s[warp] = alpha;
    __syncthreads();
    for (int h = 0; h < kSimpleHeads; ++h) acc[h][0] *= a_s[h], acc[h][1] *= a_s[h];
    for (int t = 0; t < kSimpleTile; ++t) {
      const float2 v =
          __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(rows + t * kStride + 2 * tid));
#pragma unroll
      for (int h = 0; h < kSimpleHeads; ++h)
        acc[h][0] = fmaf(p_s[h][t], v.x, acc[h][0]), acc[h][1] = fmaf(p_s[h][t], v.y, acc[h][1]);
    }
  }
  const size_t base = (size_t(b) * n_split + split) * p.n_head;
  for (int h = 0; h < kSimpleHeads; ++h)
    if (h0 + h < p.n_head)
      *reinterpret_cast<float2*>(part_o + (base + h0 + h) * kMlaLatent + 2 * tid) =
          make_float2(acc[h][0], acc[h][1]);
  if (lane == 0 && h0 + warp < p.n_head)
    part_ml[(base + h0 + warp) * 2] = m, part_ml[(base + h0 + warp) * 2 + 1] = l;
}

// grid (n_head, n_seq), kCombineGroups x 128 threads x 4 dims: group gi merges splits gi, gi + 4, ... with a
// running max (the loads of its splits in flight together), then group 0 merges the groups' (max, sum,
// partial o) in group order through shared memory. An empty split (m = -inf, its partials never written)
// adds nothing. (One group with a max pass first: 12.8 us for 33 splits at batch 1, session 9's ncu.)
constexpr int kCombineGroups = 4, kCombineThreads = kMlaLatent / 4;
__global__ void __launch_bounds__(kCombineGroups* kCombineThreads)
    mla_combine(MlaDecodeParams p, int n_split, const float* part_o, const float* part_ml) {
  __shared__ float4 o_s[kCombineGroups][kCombineThreads];
  __shared__ float m_s[kCombineGroups], l_s[kCombineGroups];
  const int h = blockIdx.x, b = blockIdx.y;
  const int gi = threadIdx.x / kCombineThreads, tid = threadIdx.x % kCombineThreads, d = tid * 4;
  float M = -INFINITY, L = 0.f;
  float4 o = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll 4
  for (int s = gi; s < n_split; s += kCombineGroups) {
    const size_t i = (size_t(b) * n_split + s) * p.n_head + h;
    const float m = part_ml[i * 2], l = part_ml[i * 2 + 1];
    const float4 v = *reinterpret_cast<const float4*>(part_o + i * kMlaLatent + d);
    // selects, not a branch: the unrolled splits' loads stay in flight together (a branch per split kept
    // one); an unwritten split's v may hold anything, so it is never multiplied in
    const bool live = m != -INFINITY;
    const float m_new = fmaxf(M, m), a = __expf(M - m_new), w = __expf(m - m_new);
    L = live ? L * a + w * l : L;
    o.x = live ? o.x * a + w * v.x : o.x, o.y = live ? o.y * a + w * v.y : o.y;
    o.z = live ? o.z * a + w * v.z : o.z, o.w = live ? o.w * a + w * v.w : o.w;
    M = live ? m_new : M;
  }
  o_s[gi][tid] = o;
  if (tid == 0) m_s[gi] = M, l_s[gi] = L;
  __syncthreads();
  if (gi != 0) return;
  float Mg = m_s[0];
#pragma unroll
  for (int g = 1; g < kCombineGroups; ++g) Mg = fmaxf(Mg, m_s[g]);
  float Lg = 0.f;
  float4 og = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll
  for (int g = 0; g < kCombineGroups; ++g) {
    if (m_s[g] == -INFINITY) continue;  // a group without a live split
    const float w = __expf(m_s[g] - Mg);
    const float4 v = o_s[g][tid];
    Lg += w * l_s[g];
    og.x += w * v.x, og.y += w * v.y, og.z += w * v.z, og.w += w * v.w;
  }
  const float r = 1.f / Lg;
  *reinterpret_cast<float4*>(p.out + (size_t(b) * p.n_head + h) * kMlaLatent + d) =
      make_float4(og.x * r, og.y * r, og.z * r, og.w * r);
}

void combine(const MlaDecodeParams& p, const Split& s, float* part_o, GpuContext& g) {
  const float* part_ml = part_o + size_t(p.n_seq) * s.n_split * p.n_head * kMlaLatent;
  mla_combine<<<dim3(p.n_head, p.n_seq), kCombineGroups * kCombineThreads, 0, g.stream>>>(p, s.n_split,
                                                                                          part_o, part_ml);
  K3_CUDA_LAUNCH_CHECK();
}

// K3_MLA_KERNEL=mma|wgmma|wgmma_hn forces a kernel (benches, tests). Otherwise the heads-as-N warpgroup
// kernel runs when a step reads at least kWgMinRows cache rows: measured on the H200 (docs/perf.md, session
// 4), the heads-as-M wgmma kernel is 1.38x faster than mma.sync at b1 x 32K and 2.16x at b64 x 32K, mma.sync
// 1.24x faster at b1 x 4K (nothing measured between); on an H100 (session 15, call 4) heads-as-N is 1.24x
// faster than heads-as-M at b64 x 32K, 1.05x at b1 x 32K, 1.19x at b1 x 128K, and equal at b1 x 4K.
constexpr int64_t kWgMinRows = 16384;

enum class Kernel { mma, wgmma, wgmma_hn };

Kernel pick_kernel(const MlaDecodeParams& p) {
  static const int forced = [] {
    const std::string e = env_value("K3_MLA_KERNEL");
    return e == "wgmma_hn" ? 2 : e == "wgmma" ? 1 : e == "mma" ? 0 : -1;
  }();
  if (p.exact_p) return Kernel::mma;  // the wgmma kernels round P to bf16 (mla_decode.h)
  if (forced >= 0) return Kernel(forced);
  return int64_t(p.n_seq) * p.max_ctx >= kWgMinRows ? Kernel::wgmma_hn : Kernel::mma;
}

void run_split(const MlaDecodeParams& p, GpuContext& g, Kernel k) {
  const int heads = k == Kernel::wgmma_hn ? kWgHnHeads : k == Kernel::wgmma ? kWgHeads : kMmaHeads;
  const Split s = fit_split(p, g, heads);
  float* part_o = static_cast<float*>(g.workspace);
  float* part_ml = part_o + size_t(p.n_seq) * s.n_split * p.n_head * kMlaLatent;
  if (k == Kernel::wgmma_hn)
    launch_split_wgmma_hn(p, s, part_o, part_ml, g.stream);
  else if (k == Kernel::wgmma)
    launch_split_wgmma(p, s, part_o, part_ml, g.stream);
  else
    launch_split_mma(p, s, part_o, part_ml, g.stream);
  combine(p, s, part_o, g);
}

}  // namespace
}  // namespace mla_detail

using namespace mla_detail;

size_t mla_decode_workspace_bytes(const MlaDecodeParams& p, int n_split) {
  if (n_split > 0) return partial_bytes(p, n_split);
  int most = 0;
  for (int heads : {kMmaHeads, kWgHeads, kWgHnHeads}) most = std::max(most, choose_split(p, heads, 0).n_split);
  return partial_bytes(p, most);
}

void mla_decode_cuda(const MlaDecodeParams& p, GpuContext& g) {
  run_split(p, g, pick_kernel(p));
}

void mla_decode_cuda_mma(const MlaDecodeParams& p, GpuContext& g) {
  run_split(p, g, Kernel::mma);
}

void mla_decode_cuda_wgmma(const MlaDecodeParams& p, GpuContext& g) {
  K3_ASSERT(!p.exact_p);  // the wgmma kernel rounds P to bf16
  run_split(p, g, Kernel::wgmma);
}

void mla_decode_cuda_wgmma_hn(const MlaDecodeParams& p, GpuContext& g) {
  K3_ASSERT(!p.exact_p);  // the wgmma kernels round P to bf16
  run_split(p, g, Kernel::wgmma_hn);
}

void mla_decode_cuda_simple(const MlaDecodeParams& p, GpuContext& g) {
  const Split s = fit_split(p, g, kSimpleHeads);
  float* part_o = static_cast<float*>(g.workspace);
  float* part_ml = part_o + size_t(p.n_seq) * s.n_split * p.n_head * kMlaLatent;
  const dim3 grid((p.n_head + kSimpleHeads - 1) / kSimpleHeads, s.n_split, p.n_seq);
  mla_split_simple<<<grid, kSimpleThreads, 0, g.stream>>>(p, s.n_split, s.split_len, part_o, part_ml);
  K3_CUDA_LAUNCH_CHECK();
  combine(p, s, part_o, g);
}

}  // namespace k3
