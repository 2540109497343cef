// attn_res_gpu.cu: Block Attention Residuals on the GPU (model/attn_res.cpp, MODEL.md §7).
//
//   V = [B_0, ..., B_{n-1}, p];  s_i = (q . V_i) rsqrt(mean_d(V_i^2) + eps);  alpha = softmax_i(s)
//   out = bf16(sum_i alpha_i V_i)                                   per token, fp32 inside
// One block per token; the n source pointers (n = finished blocks + 1, at most kMaxSources) travel by value.
#include <cmath>

#include "gpu/blocks_gpu.cuh"

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

}  // namespace

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
