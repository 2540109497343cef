// gpu_stub.cpp: CPU-only build: context.h / arena.h entry points report that there is no CUDA.
#ifndef K3_HAVE_CUDA
#include "gpu/arena.h"
#include "gpu/context.h"

namespace k3::gpu {

namespace {
Status no_cuda() {
  return Status(Code::unsupported, "no CUDA device (built without CUDA: -DK3_CUDA=ON)");
}
}  // namespace

Status create_context(GpuContext* g, const ContextOptions&) {
  *g = GpuContext{};
  return no_cuda();
}
void destroy_context(GpuContext* g) {
  if (g) *g = GpuContext{};
}
Status synchronize(GpuContext&) {
  return no_cuda();
}
Status last_error() {
  return {};
}
Status malloc_device(void** ptr, size_t) {
  *ptr = nullptr;
  return no_cuda();
}
void free_device(void*) {}
Status copy_to_device(void*, const void*, size_t, GpuContext&) {
  return no_cuda();
}
Status copy_to_host(void*, const void*, size_t, GpuContext&) {
  return no_cuda();
}
Status copy_on_device(void*, const void*, size_t, GpuContext&) {
  return no_cuda();
}
Status memset_device(void*, int, size_t, GpuContext&) {
  return no_cuda();
}

Status DeviceArena::init(size_t, const char* name) {
  destroy();
  name_ = name;
  return no_cuda();
}
void DeviceArena::destroy() {
  base_ = nullptr;
  capacity_ = used_ = high_water_ = 0;
  owned_ = false;
}

}  // namespace k3::gpu
#endif
