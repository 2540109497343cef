// gpu.h: what CPU-side code needs to name GPU work without including CUDA headers.
//
// Every op's contract header declares its CUDA backend as `void <op>_cuda(const <Op>Params& p, GpuContext& g)`:
// the same params struct as the CPU backends, with every pointer a DEVICE pointer (fp32 activations unless the
// header says otherwise), enqueued on g.stream, asynchronous (the caller synchronizes). The definitions live in
// src/ops/<op>_cuda.cu and exist only when built with -DK3_CUDA=ON (K3_HAVE_CUDA defined); without CUDA the
// declarations are present but must not be called (k3::cuda::device_count() is 0).
#pragma once

#include <cstddef>

struct CUstream_st;  // cudaStream_t is CUstream_st*

namespace k3 {

using GpuStream = CUstream_st*;

// One stream with its cuBLAS(Lt) handles and a device scratch buffer, owned by whoever created it
// (src/gpu/context.h makes and frees them). Ops may use `workspace` freely between calls on this stream.
struct GpuContext {
  GpuStream stream = nullptr;
  void* cublas = nullptr;    // cublasHandle_t bound to `stream`
  void* cublaslt = nullptr;  // cublasLtHandle_t
  void* workspace = nullptr;  // device scratch
  size_t workspace_bytes = 0;
  bool allow_tf32 = false;    // fp32 GEMMs may use TF32 only when true (never in exactness checks)
};

}  // namespace k3
