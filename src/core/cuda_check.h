// cuda_check.h: every CUDA runtime / cuBLAS call is checked; a failure becomes a Status naming the call,
// file and line (recoverable, e.g. out of memory) or, inside kernels' host wrappers, an assert.
#pragma once

#include <string>

#include "core/status.h"

namespace k3::cuda {

// Number of visible CUDA devices; 0 when built without CUDA or when no device/driver is present.
int device_count();
// "NVIDIA H200, sm_90, 132 SMs, 139.8 GiB" for device `index`, or the error.
Result<std::string> describe_device(int index);

}  // namespace k3::cuda

#ifdef __CUDACC__
#include <cuda_runtime.h>
#define K3_CUDA_CHECK(call)                                                                              \
  do {                                                                                                   \
    cudaError_t k3_err_ = (call);                                                                        \
    if (k3_err_ != cudaSuccess)                                                                          \
      return ::k3::Status(::k3::Code::internal, std::string(#call) + " failed: " +                       \
                                                    cudaGetErrorString(k3_err_) + " at " + __FILE__ + \
                                                    ":" + std::to_string(__LINE__));                     \
  } while (0)
#endif
