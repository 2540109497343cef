// sigmoid_cuda.cu: elementwise sigmoid on the GPU (sigmoid.h), one thread per element, fp32 accurate expf:
// y = 1 / (1 + exp(-x)) (x = -inf gives 0, +inf gives 1, NaN stays NaN).
#include "ops/cuda_util.cuh"
#include "ops/sigmoid.h"

namespace k3 {

namespace {

__global__ void sigmoid_kernel(SigmoidParams p, int64_t ldx, int64_t ldy) {
  const int64_t e = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (e >= p.n_row * p.d) return;
  const int64_t t = e / p.d, i = e % p.d;
  p.y[t * ldy + i] = 1.0f / (1.0f + expf(-p.x[t * ldx + i]));
}

}  // namespace

void sigmoid_cuda(const SigmoidParams& p, GpuContext& g) {
  if (p.n_row <= 0 || p.d <= 0) return;
  const int64_t ldx = p.ldx ? p.ldx : p.d, ldy = p.ldy ? p.ldy : p.d;
  sigmoid_kernel<<<cuda_ops::blocks_for(p.n_row * p.d, 256), 256, 0, g.stream>>>(p, ldx, ldy);
  K3_CUDA_LAUNCH_CHECK();
}

}  // namespace k3
