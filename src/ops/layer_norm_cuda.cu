// layer_norm_cuda.cu: LayerNorm on the GPU (layer_norm.h). One block per row, fp32 two-pass statistics
// (mean, then the mean of squared deviations) as block reductions, like layer_norm_cpu:
//   mu = sum x / d;  r = 1 / sqrt(sum (x - mu)^2 / d + eps);  y = (x - mu) * r * gain + bias
#include "ops/cuda_util.cuh"
#include "ops/layer_norm.h"

namespace k3 {

namespace {

using namespace cuda_ops;

__global__ void layer_norm_kernel(LayerNormParams p, int64_t ldx, int64_t ldy) {
  __shared__ float red[32];
  const int64_t t = blockIdx.x;
  const float* x = p.x + t * ldx;
  float* y = p.y + t * ldy;
  float s = 0.f;
  for (int64_t i = threadIdx.x; i < p.d; i += blockDim.x) s += x[i];
  const float mu = block_sum(s, red) / float(p.d);
  float s2 = 0.f;
  for (int64_t i = threadIdx.x; i < p.d; i += blockDim.x) s2 += (x[i] - mu) * (x[i] - mu);
  const float r = 1.0f / sqrtf(block_sum(s2, red) / float(p.d) + p.eps);  // all reads done (in place ok)
  for (int64_t i = threadIdx.x; i < p.d; i += blockDim.x) {
    const float gn = p.gain ? p.gain[i] : 1.0f, b = p.bias ? p.bias[i] : 0.0f;
    y[i] = (x[i] - mu) * r * gn + b;
  }
}

}  // namespace

void layer_norm_cuda(const LayerNormParams& p, GpuContext& g) {
  if (p.n_row <= 0 || p.d <= 0) return;
  const int64_t ldx = p.ldx ? p.ldx : p.d, ldy = p.ldy ? p.ldy : p.d;
  layer_norm_kernel<<<unsigned(p.n_row), row_threads(p.d), 0, g.stream>>>(p, ldx, ldy);
  K3_CUDA_LAUNCH_CHECK();
}

}  // namespace k3
