// softmax_cuda.cu: row softmax on the GPU (softmax.h). One block per row, three passes as softmax_cpu:
//   m = max_i scale * x[i];  y[i] = exp(scale * x[i] - m);  y[i] /= sum_j y[j]
// fp32 with accurate expf. -inf entries give 0; an all -inf row gives NaN (0/0 through exp(NaN)), as the
// reference does.
#include "ops/cuda_util.cuh"
#include "ops/softmax.h"

namespace k3 {

namespace {

using namespace cuda_ops;

__global__ void softmax_kernel(SoftmaxParams p, int64_t ldx, int64_t ldy) {
  __shared__ float red[32];
  const int64_t t = blockIdx.x;
  const float* x = p.x + t * ldx;
  float* y = p.y + t * ldy;
  const float s = p.scale;
  float m = -INFINITY;
  for (int64_t i = threadIdx.x; i < p.n; i += blockDim.x) m = fmaxf(m, s * x[i]);
  m = block_max(m, red);
  float sum = 0.f;
  for (int64_t i = threadIdx.x; i < p.n; i += blockDim.x) {  // each thread rewrites only what it read
    const float e = expf(s * x[i] - m);
    y[i] = e;
    sum += e;
  }
  const float inv = 1.0f / block_sum(sum, red);
  for (int64_t i = threadIdx.x; i < p.n; i += blockDim.x) y[i] *= inv;
}

}  // namespace

void softmax_cuda(const SoftmaxParams& p, GpuContext& g) {
  if (p.n_row <= 0 || p.n <= 0) return;
  const int64_t ldx = p.ldx ? p.ldx : p.n, ldy = p.ldy ? p.ldy : p.n;
  softmax_kernel<<<unsigned(p.n_row), row_threads(p.n), 0, g.stream>>>(p, ldx, ldy);
  K3_CUDA_LAUNCH_CHECK();
}

}  // namespace k3
