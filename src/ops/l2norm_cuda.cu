// l2norm_cuda.cu: per-head L2 normalization on the GPU (l2norm.h). One warp per (row, head): the fp32
// sum of squares is a warp reduction, then y = x * (scale / sqrt(ss + eps)) as in l2norm_cpu.
#include "ops/cuda_util.cuh"
#include "ops/l2norm.h"

namespace k3 {

namespace {

using namespace cuda_ops;

constexpr int kWarps = 8;  // (row, head) pairs per block

__global__ void l2norm_kernel(L2NormParams p, int64_t ldx, int64_t ldy) {
  const int64_t pair = int64_t(blockIdx.x) * kWarps + (threadIdx.x >> 5);
  if (pair >= p.n_row * p.n_head) return;  // whole warps leave together: the shuffles stay full
  const int lane = threadIdx.x & 31;
  const int64_t t = pair / p.n_head, h = pair % p.n_head;
  const float* x = p.x + t * ldx + h * p.d_head;
  float* y = p.y + t * ldy + h * p.d_head;
  float ss = 0.f;
  for (int64_t i = lane; i < p.d_head; i += 32) ss += x[i] * x[i];
  ss = warp_sum(ss);  // every lane has read its x before any lane writes y (in place ok)
  const float f = p.scale / sqrtf(ss + p.eps);
  for (int64_t i = lane; i < p.d_head; i += 32) y[i] = x[i] * f;
}

}  // namespace

void l2norm_cuda(const L2NormParams& p, GpuContext& g) {
  if (p.n_row <= 0 || p.n_head <= 0 || p.d_head <= 0) return;
  const int64_t width = p.n_head * p.d_head;
  const int64_t ldx = p.ldx ? p.ldx : width, ldy = p.ldy ? p.ldy : width;
  l2norm_kernel<<<blocks_for(p.n_row * p.n_head, kWarps), kWarps * 32, 0, g.stream>>>(p, ldx, ldy);
  K3_CUDA_LAUNCH_CHECK();
}

}  // namespace k3
