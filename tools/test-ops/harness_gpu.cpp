// harness_gpu.cpp: the device side of RunContext (harness.h): uploads, output mirrors with their guard
// bytes, the timed op loop and the download. Uses only gpu/context.h, so it builds without CUDA too
// (the calls then fail with "no CUDA device" and the harness never selects the cuda backend).
#include <chrono>

#include "gpu/context.h"
#include "harness.h"

namespace k3::opt {

RunContext::~RunContext() {
  for (void* p : dev_allocs_) gpu::free_device(p);
}

void* RunContext::dev_upload(const void* host, size_t bytes) {
  if (!gpu) {
    gpu_status_ = Status(Code::internal, "dev_in/dev_out outside the cuda backend");
    return nullptr;
  }
  void* d = nullptr;
  Status st = gpu::malloc_device(&d, bytes);
  if (st.ok()) {
    dev_allocs_.push_back(d);
    st = gpu::copy_to_device(d, host, bytes, *gpu);
  }
  if (!st.ok() && gpu_status_.ok()) gpu_status_ = st;
  return d;
}

void* RunContext::dev_mirror(int slot) {
  GuardedBuffer& b = slots[size_t(slot)].buf;
  for (const Mirror& m : mirrors_)
    if (m.slot == slot) return m.dev;
  void* d = dev_upload(b.data(), b.bytes.size());  // the elements and the 64 guard bytes after them
  if (d) mirrors_.push_back({slot, d});
  return d;
}

float* RunContext::dev_out_f32(int slot, int64_t n) {
  out_f32(slot, n);
  return static_cast<float*>(dev_mirror(slot));
}

int32_t* RunContext::dev_out_i32(int slot, int64_t n) {
  out_i32(slot, n);
  return static_cast<int32_t*>(dev_mirror(slot));
}

void RunContext::gpu_run(const std::function<void()>& op) {
  if (!gpu || !gpu_status_.ok()) return;  // an upload failed: finish_gpu reports it
  if (gpu_repeat <= 1) {
    op();
    return;
  }
  Status st = gpu::synchronize(*gpu);  // the uploads are not part of the time
  using clock = std::chrono::steady_clock;
  const auto t0 = clock::now();
  for (int r = 0; r < gpu_repeat && st.ok(); ++r) op();
  if (st.ok()) st = gpu::synchronize(*gpu);
  gpu_seconds += std::chrono::duration<double>(clock::now() - t0).count();
  if (!st.ok() && gpu_status_.ok()) gpu_status_ = st;
}

Status RunContext::finish_gpu() {
  Status st = gpu_status_;
  if (gpu && st.ok()) st = gpu::synchronize(*gpu);  // also reports a kernel that faulted
  for (const Mirror& m : mirrors_) {
    GuardedBuffer& b = slots[size_t(m.slot)].buf;
    if (st.ok()) st = gpu::copy_to_host(b.data(), m.dev, b.bytes.size(), *gpu);
  }
  if (gpu && st.ok()) st = gpu::synchronize(*gpu);
  for (void* p : dev_allocs_) gpu::free_device(p);
  dev_allocs_.clear();
  mirrors_.clear();
  gpu_status_ = Status();
  return st;
}

}  // namespace k3::opt
