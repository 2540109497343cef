// arena.cu: the one cudaMalloc behind a DeviceArena (arena.h); the bump allocation itself is in the header.
#include <cuda_runtime.h>

#include <string>

#include "core/cuda_check.h"
#include "gpu/arena.h"

namespace k3::gpu {

Status DeviceArena::init(size_t capacity, const char* name) {
  destroy();
  name_ = name;
  void* p = nullptr;
  const cudaError_t err = cudaMalloc(&p, capacity ? capacity : 1);
  if (err != cudaSuccess) {
    cudaGetLastError();  // an out-of-memory cudaMalloc leaves no sticky error, but clear it anyway
    size_t free_b = 0, total_b = 0;
    cudaMemGetInfo(&free_b, &total_b);
    cudaGetLastError();
    return Status(err == cudaErrorMemoryAllocation ? Code::out_of_memory : Code::internal,
                  std::string(name) + ": cudaMalloc of " + std::to_string(capacity) +
                      " bytes failed: " + cudaGetErrorString(err) + " (device has " + std::to_string(free_b) +
                      " of " + std::to_string(total_b) + " bytes free)");
  }
  base_ = static_cast<char*>(p);
  capacity_ = capacity;
  owned_ = true;
  return {};
}

void DeviceArena::destroy() {
  if (owned_ && base_) cudaFree(base_);  // an error here (context already torn down) is not recoverable
  base_ = nullptr;
  capacity_ = used_ = high_water_ = 0;
  owned_ = false;
}

}  // namespace k3::gpu
