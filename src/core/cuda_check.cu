#include "core/cuda_check.h"

#include <cuda_runtime.h>

#include <cstdio>

namespace k3::cuda {

int device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();  // clear the sticky "no driver" error
    return 0;
  }
  return n;
}

static Status query(int index, std::string* out) {
  cudaDeviceProp p{};
  K3_CUDA_CHECK(cudaGetDeviceProperties(&p, index));
  char buf[256];
  std::snprintf(buf, sizeof buf, "%s, sm_%d%d, %d SMs, %.1f GiB", p.name, p.major, p.minor,
                p.multiProcessorCount, double(p.totalGlobalMem) / (1 << 30));
  *out = buf;
  return {};
}

Result<std::string> describe_device(int index) {
  std::string s;
  Status st = query(index, &s);
  if (!st.ok()) return st;
  return s;
}

}  // namespace k3::cuda
