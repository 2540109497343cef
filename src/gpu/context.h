// context.h: making and freeing a GpuContext (core/gpu.h), and the few host-side device calls everyone
// needs (copies, sync) as Status-returning functions, so CPU-side code never includes CUDA headers.
//
//   GpuContext g;
//   K3_RETURN_IF_ERROR(gpu::create_context(&g, {.device = 0, .workspace_bytes = 256 << 20}));
//   ... enqueue ops on g.stream (ops/<op>.h: <op>_cuda(params, g)) ...
//   K3_RETURN_IF_ERROR(gpu::synchronize(g));   // also reports a kernel that failed asynchronously
//   gpu::destroy_context(&g);                  // or let a ContextOwner do it
//
// create_context selects `device` on the calling thread, makes a non-blocking stream, a cuBLAS handle bound
// to it (pointer mode host, CUBLAS_PEDANTIC_MATH unless allow_tf32: fp32 GEMMs stay true fp32), a cuBLASLt
// handle and a workspace of workspace_bytes (ops use it as scratch: bf16 copies of x, decoded weight tiles,
// the cuBLASLt workspace). Every failure is a Status naming the call; a partly made context is freed.
// Built without CUDA, create_context returns Code::unsupported and the rest are no-ops / errors.
#pragma once

#include <cstddef>

#include "core/gpu.h"
#include "core/status.h"

namespace k3::gpu {

struct ContextOptions {
  int device = 0;
  size_t workspace_bytes = size_t(256) << 20;  // 256 MiB: enough for a 4096 x 8192 fp32 weight tile
  bool allow_tf32 = false;
};

Status create_context(GpuContext* g, const ContextOptions& opt = {});
// Frees the handles, the workspace and the stream (after synchronizing); g is reset. Null-safe, idempotent.
void destroy_context(GpuContext* g);

// Waits for g.stream and reports any asynchronous error (a failed kernel) as a Status.
Status synchronize(GpuContext& g);
// Reports (and clears) a launch error left by the last kernel launch on this thread, without waiting.
Status last_error();

// Plain device memory, outside any arena (tests, one-off buffers). free_device(nullptr) is a no-op.
Status malloc_device(void** ptr, size_t bytes);
void free_device(void* ptr);
// Asynchronous on g.stream (host memory need not be pinned: then the copy is synchronous for the host).
Status copy_to_device(void* dst, const void* src, size_t bytes, GpuContext& g);
Status copy_to_host(void* dst, const void* src, size_t bytes, GpuContext& g);
Status copy_on_device(void* dst, const void* src, size_t bytes, GpuContext& g);
Status memset_device(void* dst, int byte, size_t bytes, GpuContext& g);

// Owns a context for a scope.
class ContextOwner {
 public:
  ContextOwner() = default;
  ~ContextOwner() { destroy_context(&g_); }
  ContextOwner(const ContextOwner&) = delete;
  ContextOwner& operator=(const ContextOwner&) = delete;
  Status create(const ContextOptions& opt = {}) {
    destroy_context(&g_);
    return create_context(&g_, opt);
  }
  GpuContext& get() { return g_; }

 private:
  GpuContext g_;
};

}  // namespace k3::gpu
