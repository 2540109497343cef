// attn_res_gpu.cu: Block Attention Residuals on the GPU (model/attn_res.cpp, MODEL.md §7).
//
//   V = [B_0, ..., B_{n-1}, p];  s_i = (q . V_i) rsqrt(mean_d(V_i^2) + eps);  alpha = softmax_i(s)
//   out = bf16(sum_i alpha_i V_i)                                   per token, fp32 inside
// One block per token; the n source pointers (n = finished blocks + 1, at most kMaxSources) travel by value.
//
// attn_res_norm_gpu: the mix and the RMSNorm that follows it (the layer's input norm) in one kernel, for up
// to kFastSources sources: one pass over the sources for every dot product and sum of squares (one block
// reduction of 2n values instead of 2n in turn), then the mix, its sum of squares and the norm:
//   a = mix (rounding as above);  y = RMSNorm(a; w) with rms_norm.h's rounding points
// At one token the model's norms were single-CTA kernels with 2n dependent reductions (session 6). Default
// since session 7 (H200: every GPU test and the K3 slice's GPU = CPU checks pass with it; the slice's norm
// module at B = 1, T = 4K 0.355 -> 0.250 ms); K3_ATTN_RES_NORM_FUSED=0 runs the mix kernel and rms_norm.
#include <cmath>

#include "core/env.h"
#include "gpu/blocks_gpu.cuh"
#include "ops/cuda_util.cuh"

namespace k3::gpu {

namespace {

constexpr int kMaxSources = 64;
constexpr int kMixThreads = 256;

struct Sources {
  const float* v[kMaxSources];
  int n;
};

__device__ float block_sum(float v, float* red) {
  for (int off = 16; off > 0; off >>= 1) v += __shfl_xor_sync(0xffffffffu, v, off);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  __syncthreads();
  if (lane == 0) red[warp] = v;
  __syncthreads();
  float s = 0.f;
  for (int i = 0; i < int(blockDim.x / 32); ++i) s += red[i];
  return s;
}

__global__ void attn_res_kernel(Sources src, const float* q, float eps, int64_t D, float* out, bool bf16) {
  __shared__ float red[kMixThreads / 32];
  __shared__ float score[kMaxSources];
  const int64_t t = blockIdx.x;
  for (int i = 0; i < src.n; ++i) {
    const float* v = src.v[i] + t * D;
    float dot = 0.f, ss = 0.f;
    for (int64_t d = threadIdx.x; d < D; d += blockDim.x) {
      dot += q[d] * v[d];
      ss += v[d] * v[d];
    }
    dot = block_sum(dot, red);
    ss = block_sum(ss, red);
    if (threadIdx.x == 0) score[i] = dot / sqrtf(ss / float(D) + eps);
  }
  __syncthreads();
  float m = -INFINITY, z = 0.f;
  for (int i = 0; i < src.n; ++i) m = fmaxf(m, score[i]);
  for (int i = 0; i < src.n; ++i) z += expf(score[i] - m);
  for (int64_t d = threadIdx.x; d < D; d += blockDim.x) {
    float o = 0.f;
    for (int i = 0; i < src.n; ++i) o += (expf(score[i] - m) / z) * src.v[i][t * D + d];
    out[t * D + d] = bf16 ? round_bf16_dev(o) : o;
  }
}

constexpr int kFastSources = 16;
constexpr int kNormThreads = 512;

__global__ void __launch_bounds__(kNormThreads)
    attn_res_norm_kernel(Sources src, const float* q, float eps, int64_t D, const float* w, float* a,
                         float* y, bool bf16) {
  __shared__ float red[kNormThreads / 32][2 * kFastSources];
  __shared__ float tot[2 * kFastSources + 1];
  const int64_t t = blockIdx.x;
  const int n = src.n, warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  float dot[kFastSources], ss[kFastSources];
#pragma unroll
  for (int i = 0; i < kFastSources; ++i) dot[i] = 0.f, ss[i] = 0.f;
  for (int64_t d = threadIdx.x; d < D; d += kNormThreads) {
    const float qd = q[d];
#pragma unroll
    for (int i = 0; i < kFastSources; ++i) {
      if (i >= n) break;
      const float v = src.v[i][t * D + d];
      dot[i] += qd * v;
      ss[i] += v * v;
    }
  }
#pragma unroll
  for (int i = 0; i < kFastSources; ++i) {
    if (i >= n) break;
    const float sd = cuda_ops::warp_sum(dot[i]), sv = cuda_ops::warp_sum(ss[i]);
    if (lane == 0) red[warp][2 * i] = sd, red[warp][2 * i + 1] = sv;
  }
  __syncthreads();
  if (int(threadIdx.x) < 2 * n) {
    float s = 0.f;
    for (int k = 0; k < kNormThreads / 32; ++k) s += red[k][threadIdx.x];
    tot[threadIdx.x] = s;
  }
  __syncthreads();
  float score[kFastSources], m = -INFINITY, z = 0.f;
#pragma unroll
  for (int i = 0; i < kFastSources; ++i) {
    if (i >= n) break;
    score[i] = tot[2 * i] / sqrtf(tot[2 * i + 1] / float(D) + eps);
    m = fmaxf(m, score[i]);
  }
#pragma unroll
  for (int i = 0; i < kFastSources; ++i) {
    if (i >= n) break;
    z += expf(score[i] - m);
  }
  float ssa = 0.f;
  for (int64_t d = threadIdx.x; d < D; d += kNormThreads) {
    float o = 0.f;
#pragma unroll
    for (int i = 0; i < kFastSources; ++i) {
      if (i >= n) break;
      o += (expf(score[i] - m) / z) * src.v[i][t * D + d];
    }
    o = bf16 ? round_bf16_dev(o) : o;
    a[t * D + d] = o;
    ssa += o * o;
  }
  ssa = cuda_ops::warp_sum(ssa);
  __syncthreads();  // tot is read by every thread above
  if (lane == 0) red[warp][0] = ssa;
  __syncthreads();
  if (threadIdx.x == 0) {
    float s = 0.f;
    for (int k = 0; k < kNormThreads / 32; ++k) s += red[k][0];
    tot[2 * kFastSources] = s;
  }
  __syncthreads();
  const float r = 1.0f / sqrtf(tot[2 * kFastSources] / float(D) + eps);
  for (int64_t d = threadIdx.x; d < D; d += kNormThreads) {  // this thread's own a values
    const float x = a[t * D + d], wd = w ? w[d] : 1.f;
    y[t * D + d] =
        bf16 ? (w ? round_bf16_dev(round_bf16_dev(x * r) * wd) : round_bf16_dev(x * r)) : x * r * wd;
  }
}

}  // namespace

Status attn_res_norm_gpu(const GpuCtx& c, const std::vector<const float*>& sources, const float* q, float eps,
                         int64_t n_tok, int64_t d_model, const float* w, float* a, float* y) {
  static const bool fused = env_switch("K3_ATTN_RES_NORM_FUSED", true);
  if (!fused || int(sources.size()) > kFastSources) {
    K3_RETURN_IF_ERROR(attn_res_mix_gpu(c, sources, q, eps, n_tok, d_model, a));
    rms_norm(c, a, w, eps, n_tok, d_model, y);
    return launch_status("attn_res + rms_norm");
  }
  if (sources.empty()) return error(Code::unsupported, "AttnRes over no sources");
  if (n_tok <= 0) return ok_status();
  Sources s{};
  s.n = int(sources.size());
  for (int i = 0; i < s.n; ++i) s.v[i] = sources[size_t(i)];
  attn_res_norm_kernel<<<unsigned(n_tok), kNormThreads, 0, c.stream()>>>(s, q, eps, d_model, w, a, y,
                                                                         c.bf16());
  return launch_status("attn_res_norm");
}

Status attn_res_mix_gpu(const GpuCtx& c, const std::vector<const float*>& sources, const float* q, float eps,
                        int64_t n_tok, int64_t d_model, float* out) {
  if (sources.empty() || int(sources.size()) > kMaxSources)
    return error(Code::unsupported, "AttnRes over " + std::to_string(sources.size()) + " sources (GPU max " +
                                        std::to_string(kMaxSources) + ")");
  if (n_tok <= 0) return ok_status();
  Sources s{};
  s.n = int(sources.size());
  for (int i = 0; i < s.n; ++i) s.v[i] = sources[size_t(i)];
  attn_res_kernel<<<unsigned(n_tok), kMixThreads, 0, c.stream()>>>(s, q, eps, d_model, out, c.bf16());
  return launch_status("attn_res");
}

}  // namespace k3::gpu
