// rms_norm_cuda.cu: RMSNorm on the GPU (rms_norm.h). One block per row: the fp32 sum of squares is a
// block reduction, then every thread writes its columns with the same rounding points as rms_norm_cpu:
//   r = 1 / sqrt(ss / d + eps)  (IEEE sqrt and division, not rsqrtf)
//   fp32: y = x * r * w        bf16: y = bf16(bf16(x * r) * w)   (no weight: y = bf16(x * r))
//
// Few wide rows (decode): rms_norm_cluster_kernel gives each row a cluster of kCluster CTAs, one float4 of
// the row per thread (read once, kept in a register); the CTAs' partial sums of squares are exchanged
// through distributed shared memory and added in rank order, so every CTA gets the same r. Only the fp32
// summation order differs from the one-block kernel. K3_NORM_CLUSTER=0 keeps the one-block kernel.
#include <cooperative_groups.h>

#include <algorithm>
#include <cstdint>

#include "core/env.h"
#include "ops/cuda_util.cuh"
#include "ops/rms_norm.h"

namespace k3 {

namespace {

using namespace cuda_ops;

__global__ void rms_norm_kernel(RmsNormParams p, int64_t ldx, int64_t ldy) {
  k3::cuda_ops::pdl_launch_dependents();  // the next kernel (a GEMV) may start fetching weights
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
    y[i] = rms_norm_out(x[i], r, w, p.w, bf16);
  }
}

constexpr int kCluster = 8;           // CTAs per row (the portable cluster size: no opt-in attribute)
constexpr int kClusterThreads = 512;  // most threads a CTA gets: one float4 per thread, d <= 16384
constexpr int kClusterMinD = 2048;    // narrower rows: one block is as quick
constexpr int kClusterRowPerSm = 2;   // cluster path while n_row <= 2 * SMs

// Grid: n_row * kCluster CTAs of round_up(ceil(d / 4 / kCluster), 32) threads; thread j of cluster rank c
// owns columns [i, i + 4), i = 4 (c * per + j). In place is safe: each thread writes only what it read.
__global__ void __cluster_dims__(kCluster, 1, 1) __launch_bounds__(kClusterThreads)
    rms_norm_cluster_kernel(RmsNormParams p, int64_t ldx, int64_t ldy) {
  k3::cuda_ops::pdl_launch_dependents();  // the next kernel (a GEMV) may start fetching weights
  namespace cg = cooperative_groups;
  const cg::cluster_group cluster = cg::this_cluster();
  __shared__ float red[kClusterThreads / 32];
  __shared__ float part;  // this CTA's partial sum of squares, read by the whole cluster
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, n_warp = blockDim.x / 32;
  const int64_t t = blockIdx.x / kCluster, per = (p.d / 4 + kCluster - 1) / kCluster;
  const int64_t i = 4 * (int64_t(cluster.block_rank()) * per + threadIdx.x);
  const bool live = threadIdx.x < per && i < p.d;
  const float4 x =
      live ? *reinterpret_cast<const float4*>(p.x + t * ldx + i) : make_float4(0.f, 0.f, 0.f, 0.f);
  const float4 w =  // loaded with x: one memory round trip
      live && p.w ? *reinterpret_cast<const float4*>(p.w + i) : make_float4(1.f, 1.f, 1.f, 1.f);
  float ss = warp_sum(x.x * x.x + x.y * x.y + x.z * x.z + x.w * x.w);
  if (lane == 0) red[warp] = ss;
  __syncthreads();
  if (warp == 0) {
    ss = warp_sum(lane < n_warp ? red[lane] : 0.f);
    if (lane == 0) part = ss;
  }
  cluster.sync();  // every CTA's part is written (release / acquire at cluster scope)
  ss = 0.f;
  if (lane < kCluster) ss = *cluster.map_shared_rank(&part, lane);
  ss = warp_sum(ss);         // butterfly: the same sum in every lane, warp and CTA
  cluster.barrier_arrive();  // done reading the others' part
  const float r = 1.0f / sqrtf(ss / float(p.d) + p.eps);
  if (live) {
    const bool bf16 = p.precision == Precision::bf16;
    const auto norm = [&](float xk, float wk) { return rms_norm_out(xk, r, wk, p.w, bf16); };
    *reinterpret_cast<float4*>(p.y + t * ldy + i) =
        make_float4(norm(x.x, w.x), norm(x.y, w.y), norm(x.z, w.z), norm(x.w, w.w));
  }
  cluster.barrier_wait();  // no CTA exits while another may still read its part
}

bool aligned16(const void* q) {
  return (reinterpret_cast<uintptr_t>(q) & 15u) == 0;
}

bool cluster_fits(const RmsNormParams& p, int64_t ldx, int64_t ldy) {
  static const bool on = env_switch("K3_NORM_CLUSTER", true);
  return on && p.d >= kClusterMinD && p.d <= 4 * int64_t(kCluster) * kClusterThreads && p.d % 4 == 0 &&
         ldx % 4 == 0 && ldy % 4 == 0 && aligned16(p.x) && aligned16(p.y) && (!p.w || aligned16(p.w)) &&
         p.n_row <= int64_t(kClusterRowPerSm) * device_sm_count();
}

}  // namespace

void rms_norm_cuda(const RmsNormParams& p, GpuContext& g) {
  if (p.n_row <= 0 || p.d <= 0) return;
  const int64_t ldx = p.ldx ? p.ldx : p.d, ldy = p.ldy ? p.ldy : p.d;
  if (cluster_fits(p, ldx, ldy)) {
    const int64_t per = (p.d / 4 + kCluster - 1) / kCluster;
    const int threads = int(std::max<int64_t>(32, (per + 31) / 32 * 32));
    rms_norm_cluster_kernel<<<unsigned(p.n_row * kCluster), unsigned(threads), 0, g.stream>>>(p, ldx, ldy);
  } else {
    rms_norm_kernel<<<unsigned(p.n_row), row_threads(p.d), 0, g.stream>>>(p, ldx, ldy);
  }
  K3_CUDA_LAUNCH_CHECK();
}

}  // namespace k3
