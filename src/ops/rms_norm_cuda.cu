// rms_norm_cuda.cu: RMSNorm on the GPU (rms_norm.h). One block per row: the fp32 sum of squares is a
// block reduction, then every thread writes its columns with the same rounding points as rms_norm_cpu:
//   r = 1 / sqrt(ss / d + eps)  (IEEE sqrt and division, not rsqrtf)
//   fp32: y = x * r * w        bf16: y = bf16(bf16(x * r) * w)   (no weight: y = bf16(x * r))
#include "ops/cuda_util.cuh"
#include "ops/rms_norm.h"

namespace k3 {

namespace {

using namespace cuda_ops;

__global__ void rms_norm_kernel(RmsNormParams p, int64_t ldx, int64_t ldy) {
  __shared__ float red[32];
  const int64_t t = blockIdx.x;
  const float* x = p.x + t * ldx;
  float* y = p.y + t * ldy;
  float ss = 0.f;
  for (int64_t i = threadIdx.x; i < p.d; i += blockDim.x) ss += x[i] * x[i];
  ss = block_sum(ss, red);  // synchronizes: every x is read before any y (in place) is written
  const float r = 1.0f / sqrtf(ss / float(p.d) + p.eps);
  const bool bf16 = p.precision == Precision::bf16;
  for (int64_t i = threadIdx.x; i < p.d; i += blockDim.x) {
    const float w = p.w ? p.w[i] : 1.0f;
    y[i] =
        bf16 ? (p.w ? round_bf16_dev(round_bf16_dev(x[i] * r) * w) : round_bf16_dev(x[i] * r)) : x[i] * r * w;
  }
}

}  // namespace

void rms_norm_cuda(const RmsNormParams& p, GpuContext& g) {
  if (p.n_row <= 0 || p.d <= 0) return;
  const int64_t ldx = p.ldx ? p.ldx : p.d, ldy = p.ldy ? p.ldy : p.d;
  rms_norm_kernel<<<unsigned(p.n_row), row_threads(p.d), 0, g.stream>>>(p, ldx, ldy);
  K3_CUDA_LAUNCH_CHECK();
}

}  // namespace k3
