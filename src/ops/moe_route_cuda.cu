// moe_route_cuda.cu: router selection on the device (moe_route.h), one warp per token.
//
// The warp stages c = sigmoid(logit) + bias (NaN -> -inf) and s in shared memory; lane l owns experts
// e = l (mod 32) and keeps the best of its own not-yet-picked experts. Each of the k rounds is a warp argmax
// over the 32 lane bests under the strict order (c desc, id asc); only the lane that owned the pick rescans
// (its items that rank after the pick). No sort, no global scratch, no host reads.
#include <cmath>

#include "ops/cuda_util.cuh"
#include "ops/moe_route.h"

namespace k3 {

namespace {

constexpr int kWarps = 4;

// (ca, ea) ranks before (cb, eb)
__device__ __forceinline__ bool before(float ca, int ea, float cb, int eb) {
  return ca > cb || (ca == cb && ea < eb);
}

__global__ void __launch_bounds__(kWarps * 32) route_kernel(MoeRouteParams p, int64_t ld) {
  extern __shared__ float smem[];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, E = p.n_expert;
  const int64_t t = int64_t(blockIdx.x) * kWarps + warp;
  if (t >= p.n_tok) return;
  float* c = smem + size_t(warp) * (3 * E);  // [E] choice scores, [E] scores, [k <= E] picks
  float* s = c + E;
  int* pick = reinterpret_cast<int*>(s + E);
  const float* lg = p.logits + t * ld;
  for (int e = lane; e < E; e += 32) {
    const float se = 1.f / (1.f + expf(-lg[e]));
    const float ce = se + p.bias[e];
    s[e] = se;
    c[e] = isnan(ce) ? -INFINITY : ce;
  }
  __syncwarp();
  // lane best among its items ranking after (prev_c, prev_e)
  auto scan = [&](float prev_c, int prev_e, bool first, float& bc, int& be) {
    bc = -INFINITY, be = -1;
    for (int e = lane; e < E; e += 32) {
      const float ce = c[e];
      if (!first && !before(prev_c, prev_e, ce, e)) continue;
      if (be < 0 || before(ce, e, bc, be)) bc = ce, be = e;
    }
  };
  float bc;
  int be;
  scan(0.f, 0, true, bc, be);
  float sum = 0.f;
  for (int j = 0; j < p.k; ++j) {
    float wc = bc;
    int we = be;
    for (int o = 16; o > 0; o >>= 1) {
      const float oc = __shfl_xor_sync(0xffffffffu, wc, o);
      const int oe = __shfl_xor_sync(0xffffffffu, we, o);
      if (oe >= 0 && (we < 0 || before(oc, oe, wc, we))) wc = oc, we = oe;
    }
    sum += s[we];  // slot order, the same in every lane
    if (lane == 0) pick[j] = we;
    if (we % 32 == lane) scan(wc, we, false, bc, be);
  }
  __syncwarp();
  for (int j = lane; j < p.k; j += 32) {
    const int e = pick[j];
    p.sel[t * p.k + j] = e;
    p.wt[t * p.k + j] = (p.renormalize ? s[e] / (sum + 1e-20f) : s[e]) * p.scaling;
  }
}

}  // namespace

void moe_route_cuda(const MoeRouteParams& p, GpuContext& g) {
  K3_ASSERT(moe_route_check(p).ok());
  if (p.n_tok == 0) return;
  const size_t smem = size_t(kWarps) * 3 * size_t(p.n_expert) * sizeof(float);
  if (smem > 48 * 1024)
    K3_CUDA_ASSERT(cudaFuncSetAttribute(route_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
  const unsigned grid = unsigned((p.n_tok + kWarps - 1) / kWarps);
  route_kernel<<<grid, kWarps * 32, smem, g.stream>>>(p, p.ld ? p.ld : p.n_expert);
  K3_CUDA_LAUNCH_CHECK();
}

}  // namespace k3
