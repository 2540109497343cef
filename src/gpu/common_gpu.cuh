// common_gpu.cuh: what every GPU model block shares (the GPU twin of model/common.h), internal to src/gpu.
//
//   GpuCtx      precision, the op context (stream, cuBLAS, workspace), the trace hook
//   rnd(x, n)   bf16 mode: x <- bf16(x) in place (a rounding point); fp32 mode: nothing
//   cb(...)     copies a named intermediate to the host for the trace hook (only when one is set, or in
//               debug builds, where every traced activation is also checked for NaN/Inf like the CPU)
//   linear      y[n_tok, out] = x W^T (ops/linear.h, cuBLAS / MXFP4 kernels), then the bf16 rounding point
//   DevBuf      stream-ordered device scratch (cudaMallocAsync / cudaFreeAsync), freed at scope end; from
//               GpuCtx::arena instead when one is set (CUDA-graph steps: no allocation inside a capture,
//               the same addresses at every replay; freed in stack order)
//
// Activations are fp32 on the device in both modes; in bf16 mode they hold bf16-representable values at
// the same rounding points as the CPU model (model/*.cpp `c.rnd` calls), so GPU = CPU can be checked name
// by name. Every kernel here is enqueued on ctx.g->stream; nothing synchronizes except cb and the MoE
// dispatch (which reads the routing on the host).
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <initializer_list>
#include <string>
#include <vector>

#include "core/cuda_check.h"
#include "core/gpu.h"
#include "gpu/arena.h"
#include "model/common.h"
#include "ops/cuda_util.cuh"
#include "ops/linear.h"
#include "ops/precision.h"

namespace k3::gpu {

constexpr int kThreads = 256;
inline unsigned blocks_for(int64_t n, int threads = kThreads) {
  return unsigned((n + threads - 1) / threads);
}

using cuda_ops::round_bf16_dev;  // bf16 round-to-nearest-even kept in fp32 (ops/cuda_util.cuh)

// A second stream for work that may run beside the main one (the shared experts beside the routed ones), with
// the two events of a fork and a join (a pattern CUDA graphs capture as edges).
struct SideStream {
  GpuContext* g = nullptr;
  cudaEvent_t fork = nullptr, join = nullptr;
};

struct GpuCtx {
  Precision prec = Precision::fp32;
  GpuContext* g = nullptr;
  const TraceFn* trace = nullptr;
  Status* guard = nullptr;             // first non-finite traced activation (debug builds)
  std::vector<float>* host = nullptr;  // staging buffer for cb
  DeviceArena* arena = nullptr;        // set: DevBuf scratch comes from here (model_gpu.cu graph steps)
  const SideStream* side = nullptr;    // set: fork_side may put work beside the main stream
  class HostStage* stage = nullptr;    // set: to_device copies through its pinned slots

  bool bf16() const { return prec == Precision::bf16; }
  bool tracing() const { return trace && *trace; }
  cudaStream_t stream() const { return g->stream; }
  void rnd(float* x, int64_t n) const;
  void cb(const char* name, int layer, const float* x, int64_t n) const;
  // cb for n_row rows of k int32 ids, each row sorted ascending (a set), handed to the hook as floats; only
  // when tracing
  void cb_sets(const char* name, int layer, const int32_t* x, int64_t n_row, int64_t k) const;
};

// Stream-ordered device buffer of floats (or raw bytes through alloc_bytes).
class DevBuf {
 public:
  DevBuf() = default;
  ~DevBuf() { release(); }
  DevBuf(const DevBuf&) = delete;
  DevBuf& operator=(const DevBuf&) = delete;
  DevBuf(DevBuf&& o) noexcept : p_(o.p_), n_(o.n_), s_(o.s_), arena_(o.arena_), mark_(o.mark_) {
    o.p_ = nullptr, o.n_ = 0;
  }
  DevBuf& operator=(DevBuf&& o) noexcept {
    if (this != &o)
      release(), p_ = o.p_, n_ = o.n_, s_ = o.s_, arena_ = o.arena_, mark_ = o.mark_, o.p_ = nullptr, o.n_ = 0;
    return *this;
  }
  Status alloc(const GpuCtx& c, int64_t n_float) { return alloc_bytes(c, size_t(n_float) * 4); }
  Status alloc_bytes(const GpuCtx& c, size_t bytes);
  void release();
  float* f() const { return static_cast<float*>(p_); }
  template <class T>
  T* as() const {
    return static_cast<T*>(p_);
  }
  int64_t size() const { return int64_t(n_ / 4); }

 private:
  void* p_ = nullptr;
  size_t n_ = 0;
  cudaStream_t s_ = nullptr;
  DeviceArena* arena_ = nullptr;  // from an arena: release pops it when it is the last block
  size_t mark_ = 0;               // the arena's used() before this block
};

// Pinned slots for the small host -> device copies a step makes (the MLA layers' block tables), so that
// cudaMemcpyAsync neither waits for the stream nor reads host memory that changes before the copy runs; a
// slot is refilled only after its last copy has run (an event each).
class HostStage {
 public:
  HostStage() = default;
  ~HostStage();
  HostStage(const HostStage&) = delete;
  HostStage& operator=(const HostStage&) = delete;
  Status copy(void* dst, const void* src, size_t bytes, cudaStream_t stream);

 private:
  struct Slot {
    void* p = nullptr;
    size_t n = 0;
    cudaEvent_t done = nullptr;
  };
  Slot slots_[4];
  int next_ = 0;
};
// dst (device) <- src (host, n bytes) on c's stream: through c.stage, else a copy the host waits for.
Status to_device(const GpuCtx& c, void* dst, const void* src, size_t n);

// y = W x (+ the bf16 rounding point unless `round` is false). ldx/ldy: row strides (0 = dense). In bf16 mode
// x must hold bf16-rounded values unless x_exact.
void linear(const GpuCtx& c, const LinearWeight& W, const float* x, int64_t n_tok, float* y,
            bool round = true, bool x_exact = false, int64_t ldx = 0, int64_t ldy = 0);
// y[i] = bf16(x[i]) for i < n, as bf16 bits, on `stream`.
void to_bf16_bits(cudaStream_t stream, const float* x, int64_t n, uint16_t* y);
// One output of linear_group: y = W x, then the bf16 rounding point unless !round.
struct LinearOut {
  const LinearWeight* W;
  float* y;
  bool round = true;
};
// linear() of several weights over one x (dense y): one GEMV launch at decode sizes (ops/linear.h
// linear_group_cuda), the same results as one linear() each.
void linear_group(const GpuCtx& c, std::initializer_list<LinearOut> outs, const float* x, int64_t n_tok);
// RMSNorm rows (ops/rms_norm.h semantics; bf16 mode has the op's two rounding points).
void rms_norm(const GpuCtx& c, const float* x, const float* w, float eps, int64_t n_row, int64_t d, float* y,
              int64_t ldx = 0, int64_t ldy = 0);

// Elementwise helpers (kernels in common_gpu.cu).
// y += x; round: then the bf16 rounding point in bf16 mode (c.rnd fused)
void add_inplace(const GpuCtx& c, float* y, const float* x, int64_t n, bool round = false);
void sigmoid_mul_inplace(const GpuCtx& c, float* z, const float* g, int64_t n);  // z *= sigmoid(g)
void copy_rows(const GpuCtx& c, float* dst, int64_t ld_dst, const float* src, int64_t ld_src, int64_t n_row,
               int64_t n_col);  // dst[r, :n_col] = src[r, :n_col]
// dst[i, :] = src[rows[i], :] for i < n (rows: device int64 array).
void gather_rows(const GpuCtx& c, float* dst, const float* src, const int64_t* rows, int64_t n, int64_t d);
Status launch_status(const char* where);  // cudaGetLastError as a Status

// Work beside the main stream: *out becomes c on the side stream, which first waits for everything enqueued
// on c.stream() so far; join_side makes c.stream() wait for everything enqueued on the side since. Scratch
// the side work uses must be allocated before the fork and released after the join (DevBuf frees in host
// order, and an arena reuses addresses at once). c.side must be set.
Status fork_side(const GpuCtx& c, GpuCtx* out);
Status join_side(const GpuCtx& c);

}  // namespace k3::gpu
