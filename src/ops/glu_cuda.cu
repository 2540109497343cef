// glu_cuda.cu: SiTU-GLU / SiLU-GLU on the GPU (glu.h), one thread per element, fp32 with the accurate
// expf / tanhf (no fast-math), the output rounded to bf16 in bf16 mode exactly as glu_cpu does:
//   SiLU: h = g * sigmoid(g) * u
//   SiTU: h = (beta1 * tanh(g / beta1) * sigmoid(g)) * (beta2 * tanh(u / beta2))   (beta2 <= 0: * u)
#include "ops/cuda_util.cuh"
#include "ops/glu.h"

namespace k3 {

namespace {

using namespace cuda_ops;

__device__ __forceinline__ float sigmoid(float x) {
  return 1.0f / (1.0f + expf(-x));
}

__global__ void glu_kernel(GluParams p, int64_t ldg, int64_t ldu, int64_t ldh) {
  k3::cuda_ops::pdl_launch_dependents();  // the next kernel (a GEMV) may start fetching weights
  const int64_t e = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (e >= p.n_tok * p.d) return;
  const int64_t t = e / p.d, i = e % p.d;
  const float g = p.g[t * ldg + i], u = p.u[t * ldu + i];
  float v;
  if (p.kind == GluKind::silu) {
    v = g * sigmoid(g) * u;
  } else {
    const float a = p.beta1 * tanhf(g / p.beta1) * sigmoid(g);
    v = a * (p.beta2 > 0 ? p.beta2 * tanhf(u / p.beta2) : u);
  }
  p.h[t * ldh + i] = p.precision == Precision::bf16 ? round_bf16_dev(v) : v;
}

}  // namespace

void glu_cuda(const GluParams& p, GpuContext& g) {
  if (p.n_tok <= 0 || p.d <= 0) return;
  const int64_t ldg = p.ldg ? p.ldg : p.d, ldu = p.ldu ? p.ldu : p.d, ldh = p.ldh ? p.ldh : p.d;
  glu_kernel<<<blocks_for(p.n_tok * p.d, 256), 256, 0, g.stream>>>(p, ldg, ldu, ldh);
  K3_CUDA_LAUNCH_CHECK();
}

}  // namespace k3
