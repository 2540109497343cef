// cuda_util.cuh: internal to src/ops/*_cuda.cu: launch checks and the block/warp reductions the row-wise
// kernels share. Not a public header (CPU code includes ops/<op>.h only).
//
// Op entry points return void (their contract is the CPU one), so a failed launch or cuBLAS call is an
// invariant violation there: K3_CUDA_ASSERT / K3_CUBLAS_ASSERT abort with the call, the error and
// file:line. Asynchronous kernel faults surface at the caller's gpu::synchronize() as a Status.
#pragma once

#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <utility>

#include "core/status.h"

#define K3_CUDA_ASSERT(call)                                                                           \
  do {                                                                                                 \
    const cudaError_t k3_e_ = (call);                                                                  \
    if (k3_e_ != cudaSuccess) {                                                                        \
      std::fprintf(stderr, "k3: %s failed: %s at %s:%d\n", #call, cudaGetErrorString(k3_e_), __FILE__, \
                   __LINE__);                                                                          \
      std::abort();                                                                                    \
    }                                                                                                  \
  } while (0)

// After a <<<...>>> launch: a bad configuration (too much shared memory, a zero grid) fails here.
#define K3_CUDA_LAUNCH_CHECK() K3_CUDA_ASSERT(cudaGetLastError())

#define K3_CUBLAS_ASSERT(call)                                                                            \
  do {                                                                                                    \
    const cublasStatus_t k3_s_ = (call);                                                                  \
    if (k3_s_ != CUBLAS_STATUS_SUCCESS) {                                                                 \
      std::fprintf(stderr, "k3: %s failed: %s at %s:%d\n", #call, cublasGetStatusString(k3_s_), __FILE__, \
                   __LINE__);                                                                             \
      std::abort();                                                                                       \
    }                                                                                                     \
  } while (0)

namespace k3::cuda_ops {

// bf16 round-to-nearest-even kept in fp32 (core/dtype.h round_bf16 on the device; NaN stays NaN).
__device__ __forceinline__ float round_bf16_dev(float v) {
  return __bfloat162float(__float2bfloat16_rn(v));
}

// One RMSNorm output with ops/rms_norm.h's rounding points: x r w in fp32; in bf16 mode bf16(bf16(x r) w),
// or bf16(x r) without a weight (has_w false, w = 1).
__device__ __forceinline__ float rms_norm_out(float x, float r, float w, bool has_w, bool bf16) {
  return bf16 ? (has_w ? round_bf16_dev(round_bf16_dev(x * r) * w) : round_bf16_dev(x * r)) : x * r * w;
}

// Programmatic dependent launch (sm_90): pdl_launch_dependents lets the stream's next kernel, if launched
// with the PDL attribute (launch_pdl), start its CTAs now; pdl_wait blocks until the previous kernel has
// finished and its writes are visible. Both return at once when the launches carry no PDL attribute.
__device__ __forceinline__ void pdl_launch_dependents() {
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
}
__device__ __forceinline__ void pdl_wait() {
  asm volatile("griddepcontrol.wait;" ::: "memory");
}

__device__ __forceinline__ float warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

__device__ __forceinline__ float warp_max(float v) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// Sum / max over the whole block (blockDim.x a multiple of 32, <= 1024); every thread gets the result.
// `red` is 32 floats of shared memory; the call synchronizes the block (so `red` can be reused after).
__device__ __forceinline__ float block_sum(float v, float* red) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, n_warp = blockDim.x >> 5;
  v = warp_sum(v);
  __syncthreads();  // a previous reduction may still be reading `red`
  if (lane == 0) red[warp] = v;
  __syncthreads();
  v = lane < n_warp ? red[lane] : 0.f;
  return warp_sum(v);
}

__device__ __forceinline__ float block_max(float v, float* red) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, n_warp = blockDim.x >> 5;
  v = warp_max(v);
  __syncthreads();
  if (lane == 0) red[warp] = v;
  __syncthreads();
  v = lane < n_warp ? red[lane] : -INFINITY;
  return warp_max(v);
}

// Threads per row for the row-wise kernels: enough to cover d in a few passes, a multiple of 32.
inline int row_threads(int64_t d) {
  int t = 32;
  while (t < 1024 && t * 4 < d) t *= 2;
  return t;
}

// Streaming multiprocessors of the current device (read once per process).
inline int device_sm_count() {
  static const int n = [] {
    int dev = 0, v = 0;
    K3_CUDA_ASSERT(cudaGetDevice(&dev));
    K3_CUDA_ASSERT(cudaDeviceGetAttribute(&v, cudaDevAttrMultiProcessorCount, dev));
    return v;
  }();
  return n;
}

// kernel<<<grid, block, smem, stream>>>(args...) with the programmatic-serialization attribute when `pdl`:
// the kernel may start while the previous one finishes, so it must call pdl_wait() before reading anything
// the earlier kernels wrote (and before writing anything they read).
template <class... P, class... A>
void launch_pdl(bool pdl, void (*kernel)(P...), dim3 grid, dim3 block, size_t smem, cudaStream_t stream,
                A&&... args) {
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = grid, cfg.blockDim = block, cfg.dynamicSmemBytes = smem, cfg.stream = stream;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = attr, cfg.numAttrs = pdl && stream ? 1 : 0;  // (not on the legacy default stream)
  K3_CUDA_ASSERT(cudaLaunchKernelEx(&cfg, kernel, std::forward<A>(args)...));
}

// Raises the dynamic shared-memory limit of `kernels` to `bytes` once per device (the > 48 KB opt-in is a
// per-device function attribute); `done` is the calling launcher's own flags.
template <class... Kernel>
void smem_opt_in(std::atomic<bool> (&done)[64], int bytes, Kernel... kernels) {
  int dev = 0;
  K3_CUDA_ASSERT(cudaGetDevice(&dev));
  if (dev < 64 && done[dev].load()) return;
  for (const void* f : {reinterpret_cast<const void*>(kernels)...})
    K3_CUDA_ASSERT(cudaFuncSetAttribute(f, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes));
  if (dev < 64) done[dev] = true;
}

inline unsigned blocks_for(int64_t n, int threads) {
  return unsigned((n + threads - 1) / threads);
}

}  // namespace k3::cuda_ops
