// common_gpu.cu: shared GPU model helpers (common_gpu.cuh).
#include "gpu/common_gpu.cuh"

#include <cuda_bf16.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>

#include "ops/cuda_util.cuh"
#include "ops/rms_norm.h"

namespace k3::gpu {

namespace {

__global__ void round_bf16_kernel(float* x, int64_t n) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) x[i] = round_bf16_dev(x[i]);
}

__global__ void f32_to_bf16_kernel(uint16_t* y, const float* x, int64_t n) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) y[i] = __bfloat16_as_ushort(__float2bfloat16_rn(x[i]));
}

template <bool ROUND>
__global__ void add_kernel(float* y, const float* x, int64_t n) {
  k3::cuda_ops::pdl_launch_dependents();  // the next kernel (a GEMV) may start fetching weights
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) y[i] = ROUND ? round_bf16_dev(y[i] + x[i]) : y[i] + x[i];
}

__global__ void sigmoid_mul_kernel(float* z, const float* g, int64_t n) {
  k3::cuda_ops::pdl_launch_dependents();  // the next kernel (a GEMV) may start fetching weights
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) z[i] *= 1.f / (1.f + expf(-g[i]));
}

__global__ void copy_rows_kernel(float* dst, int64_t ldd, const float* src, int64_t lds, int64_t n_row,
                                 int64_t n_col) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n_row * n_col) return;
  const int64_t r = i / n_col, col = i % n_col;
  dst[r * ldd + col] = src[r * lds + col];
}

__global__ void gather_rows_kernel(float* dst, const float* src, const int64_t* rows, int64_t n, int64_t d) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n * d) return;
  const int64_t r = i / d, col = i % d;
  dst[i] = src[rows[r] * d + col];
}

}  // namespace

HostStage::~HostStage() {
  for (Slot& s : slots_) {
    if (s.done) cudaEventSynchronize(s.done), cudaEventDestroy(s.done);
    cudaFreeHost(s.p);
  }
}

Status HostStage::copy(void* dst, const void* src, size_t bytes, cudaStream_t stream) {
  if (bytes == 0) return ok_status();
  Slot& s = slots_[next_];
  next_ = (next_ + 1) % int(sizeof slots_ / sizeof slots_[0]);
  if (s.done) {
    K3_CUDA_CHECK(cudaEventSynchronize(s.done));  // its last copy has run
  } else {
    K3_CUDA_CHECK(cudaEventCreateWithFlags(&s.done, cudaEventDisableTiming));
  }
  if (s.n < bytes) {
    cudaFreeHost(s.p);
    s.p = nullptr, s.n = 0;
    const size_t n = std::max(bytes, size_t(64) << 10);
    K3_CUDA_CHECK(cudaMallocHost(&s.p, n));
    s.n = n;
  }
  std::memcpy(s.p, src, bytes);
  K3_CUDA_CHECK(cudaMemcpyAsync(dst, s.p, bytes, cudaMemcpyHostToDevice, stream));
  K3_CUDA_CHECK(cudaEventRecord(s.done, stream));
  return ok_status();
}

Status to_device(const GpuCtx& c, void* dst, const void* src, size_t n) {
  if (c.stage) return c.stage->copy(dst, src, n, c.stream());
  K3_CUDA_CHECK(cudaMemcpyAsync(dst, src, n, cudaMemcpyHostToDevice, c.stream()));
  K3_CUDA_CHECK(cudaStreamSynchronize(c.stream()));
  return ok_status();
}

Status launch_status(const char* where) {
  const cudaError_t e = cudaGetLastError();
  if (e == cudaSuccess) return ok_status();
  return error(Code::internal, std::string(where) + ": CUDA error: " + cudaGetErrorString(e));
}

Status fork_side(const GpuCtx& c, GpuCtx* out) {
  K3_ASSERT(c.side && c.side->g);
  K3_CUDA_CHECK(cudaEventRecord(c.side->fork, c.stream()));
  K3_CUDA_CHECK(cudaStreamWaitEvent(c.side->g->stream, c.side->fork, 0));
  *out = c;
  out->g = c.side->g;
  out->side = nullptr;
  return ok_status();
}

Status join_side(const GpuCtx& c) {
  K3_ASSERT(c.side && c.side->g);
  K3_CUDA_CHECK(cudaEventRecord(c.side->join, c.side->g->stream));
  K3_CUDA_CHECK(cudaStreamWaitEvent(c.stream(), c.side->join, 0));
  return ok_status();
}

void GpuCtx::rnd(float* x, int64_t n) const {
  if (!bf16() || n <= 0) return;
  round_bf16_kernel<<<blocks_for(n), kThreads, 0, stream()>>>(x, n);
}

namespace {

// Device x (bytes) -> host dst for the trace named `name`, on c's stream; a failure goes to c.guard.
bool trace_copy(const GpuCtx& c, const char* name, void* dst, const void* x, size_t bytes) {
  cudaError_t e = cudaMemcpyAsync(dst, x, bytes, cudaMemcpyDeviceToHost, c.stream());
  if (e == cudaSuccess) e = cudaStreamSynchronize(c.stream());
  if (e == cudaSuccess) return true;
  if (c.guard && c.guard->ok())
    *c.guard = error(Code::internal, std::string("trace copy of '") + name + "': " + cudaGetErrorString(e));
  return false;
}

}  // namespace

void GpuCtx::cb_sets(const char* name, int layer, const int32_t* x, int64_t n_row, int64_t k) const {
  const int64_t n = n_row * k;
  if (!tracing() || n <= 0) return;
  std::vector<int32_t> v(static_cast<size_t>(n));
  if (!trace_copy(*this, name, v.data(), x, size_t(n) * 4)) return;
  for (int64_t r = 0; r < n_row; ++r) std::sort(v.begin() + r * k, v.begin() + (r + 1) * k);
  host->assign(v.begin(), v.end());
  (*trace)(name, layer, host->data(), n);
}

void GpuCtx::cb(const char* name, int layer, const float* x, int64_t n) const {
  const bool tracing = trace && *trace;
#ifdef NDEBUG
  const bool check = false;
#else
  const bool check = guard && guard->ok();
#endif
  if ((!tracing && !check) || n <= 0) return;
  host->resize(size_t(n));
  if (!trace_copy(*this, name, host->data(), x, size_t(n) * 4)) return;
  if (tracing) (*trace)(name, layer, host->data(), n);
  if (check) {
    for (int64_t i = 0; i < n; ++i)
      if (!std::isfinite((*host)[size_t(i)])) {
        char buf[160];
        std::snprintf(buf, sizeof buf, "non-finite activation in layer %d tensor '%s' at element %lld", layer,
                      name, (long long)i);
        *guard = error(Code::internal, buf);
        break;
      }
  }
}

Status DevBuf::alloc_bytes(const GpuCtx& c, size_t bytes) {
  release();
  s_ = c.stream();
  if (bytes == 0) bytes = 4;
  if (c.arena) {
    const size_t mark = c.arena->used();
    Result<void*> r = c.arena->alloc_bytes(bytes);
    if (!r.ok()) return r.status();
    p_ = r.value(), n_ = bytes, arena_ = c.arena, mark_ = mark;
    return ok_status();
  }
  const cudaError_t e = cudaMallocAsync(&p_, bytes, s_);
  if (e != cudaSuccess) {
    cudaGetLastError();
    p_ = nullptr;
    return error(Code::out_of_memory,
                 "device scratch of " + std::to_string(bytes) + " bytes: " + cudaGetErrorString(e));
  }
  n_ = bytes;
  return ok_status();
}

void DevBuf::release() {
  if (p_ && arena_) {  // stack order frees; a block freed out of order stays until the step's reset
    if (arena_->used() == size_t(static_cast<char*>(p_) - static_cast<char*>(arena_->base())) + n_)
      arena_->release(mark_);
    arena_ = nullptr;
  } else if (p_) {
    cudaFreeAsync(p_, s_);
  }
  p_ = nullptr;
  n_ = 0;
}

void linear(const GpuCtx& c, const LinearWeight& W, const float* x, int64_t n_tok, float* y, bool round,
            bool x_exact, int64_t ldx, int64_t ldy) {
  if (n_tok <= 0) return;
  LinearParams p;
  p.n_tok = n_tok;
  p.x = x;
  p.ldx = ldx;
  p.y = y;
  p.ldy = ldy;
  p.x_precision = x_exact ? Precision::fp32 : c.prec;
  p.round_bf16 = round && c.bf16();
  linear_cuda(W, p, *c.g);
}

void linear_group(const GpuCtx& c, std::initializer_list<LinearOut> outs, const float* x, int64_t n_tok) {
  if (n_tok <= 0) return;
  constexpr int kMax = 8;
  K3_ASSERT(outs.size() <= size_t(kMax));
  const LinearWeight* W[kMax];
  LinearParams p[kMax];
  int n = 0;
  for (const LinearOut& o : outs) {
    W[n] = o.W;
    p[n].n_tok = n_tok, p[n].x = x, p[n].y = o.y, p[n].x_precision = c.prec;
    p[n].round_bf16 = o.round && c.bf16();
    ++n;
  }
  linear_group_cuda(W, p, n, *c.g);
}

void rms_norm(const GpuCtx& c, const float* x, const float* w, float eps, int64_t n_row, int64_t d, float* y,
              int64_t ldx, int64_t ldy) {
  if (n_row <= 0) return;
  RmsNormParams p;
  p.n_row = n_row;
  p.d = d;
  p.x = x;
  p.ldx = ldx;
  p.w = w;
  p.y = y;
  p.ldy = ldy;
  p.eps = eps;
  p.precision = c.prec;
  rms_norm_cuda(p, *c.g);
}

void add_inplace(const GpuCtx& c, float* y, const float* x, int64_t n, bool round) {
  if (n <= 0) return;
  if (round && c.bf16())
    add_kernel<true><<<blocks_for(n), kThreads, 0, c.stream()>>>(y, x, n);
  else
    add_kernel<false><<<blocks_for(n), kThreads, 0, c.stream()>>>(y, x, n);
}

void to_bf16_bits(cudaStream_t stream, const float* x, int64_t n, uint16_t* y) {
  if (n > 0) f32_to_bf16_kernel<<<blocks_for(n), kThreads, 0, stream>>>(y, x, n);
}

void sigmoid_mul_inplace(const GpuCtx& c, float* z, const float* g, int64_t n) {
  if (n > 0) sigmoid_mul_kernel<<<blocks_for(n), kThreads, 0, c.stream()>>>(z, g, n);
}

void copy_rows(const GpuCtx& c, float* dst, int64_t ld_dst, const float* src, int64_t ld_src, int64_t n_row,
               int64_t n_col) {
  const int64_t n = n_row * n_col;
  if (n > 0)
    copy_rows_kernel<<<blocks_for(n), kThreads, 0, c.stream()>>>(dst, ld_dst, src, ld_src, n_row, n_col);
}

void gather_rows(const GpuCtx& c, float* dst, const float* src, const int64_t* rows, int64_t n, int64_t d) {
  if (n * d > 0) gather_rows_kernel<<<blocks_for(n * d), kThreads, 0, c.stream()>>>(dst, src, rows, n, d);
}

}  // namespace k3::gpu
