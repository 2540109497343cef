// context.cu: GpuContext creation and teardown, and the checked host-side device calls of context.h.
#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <string>

#include "core/cuda_check.h"
#include "gpu/context.h"

namespace k3::gpu {

namespace {

Status cublas_status(cublasStatus_t s, const char* call) {
  if (s == CUBLAS_STATUS_SUCCESS) return {};
  return Status(s == CUBLAS_STATUS_ALLOC_FAILED ? Code::out_of_memory : Code::internal,
                std::string(call) + " failed: " + cublasGetStatusString(s));
}

Status make(GpuContext* g, const ContextOptions& opt) {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) {
    cudaGetLastError();
    return Status(Code::unsupported, "no CUDA device");
  }
  if (opt.device < 0 || opt.device >= n)
    return Status(Code::invalid_argument, "CUDA device " + std::to_string(opt.device) + " does not exist (" +
                                              std::to_string(n) + " visible)");
  K3_CUDA_CHECK(cudaSetDevice(opt.device));
  cudaStream_t stream = nullptr;
  K3_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  g->stream = stream;
  cublasHandle_t h = nullptr;
  K3_RETURN_IF_ERROR(cublas_status(cublasCreate(&h), "cublasCreate"));
  g->cublas = h;
  K3_RETURN_IF_ERROR(cublas_status(cublasSetStream(h, stream), "cublasSetStream"));
  K3_RETURN_IF_ERROR(
      cublas_status(cublasSetPointerMode(h, CUBLAS_POINTER_MODE_HOST), "cublasSetPointerMode"));
  // fp32 GEMMs ask for CUBLAS_COMPUTE_32F_PEDANTIC (or _FAST_TF32 when allowed) explicitly; the handle's
  // math mode only matters for legacy calls, where it must not silently enable TF32.
  K3_RETURN_IF_ERROR(
      cublas_status(cublasSetMathMode(h, opt.allow_tf32 ? CUBLAS_TF32_TENSOR_OP_MATH : CUBLAS_DEFAULT_MATH),
                    "cublasSetMathMode"));
  cublasLtHandle_t lt = nullptr;
  K3_RETURN_IF_ERROR(cublas_status(cublasLtCreate(&lt), "cublasLtCreate"));
  g->cublaslt = lt;
  if (opt.workspace_bytes > 0) {
    void* ws = nullptr;
    const cudaError_t err = cudaMalloc(&ws, opt.workspace_bytes);
    if (err != cudaSuccess) {
      cudaGetLastError();
      return Status(Code::out_of_memory, "GPU workspace: cudaMalloc of " +
                                             std::to_string(opt.workspace_bytes) +
                                             " bytes failed: " + cudaGetErrorString(err));
    }
    g->workspace = ws;
    g->workspace_bytes = opt.workspace_bytes;
  }
  g->allow_tf32 = opt.allow_tf32;
  return {};
}

}  // namespace

Status create_context(GpuContext* g, const ContextOptions& opt) {
  K3_ASSERT(g != nullptr);
  *g = GpuContext{};
  Status st = make(g, opt);
  if (!st.ok()) destroy_context(g);
  return st;
}

void destroy_context(GpuContext* g) {
  if (!g) return;
  if (g->stream) cudaStreamSynchronize(g->stream);
  if (g->workspace) cudaFree(g->workspace);
  if (g->cublaslt) cublasLtDestroy(static_cast<cublasLtHandle_t>(g->cublaslt));
  if (g->cublas) cublasDestroy(static_cast<cublasHandle_t>(g->cublas));
  if (g->stream) cudaStreamDestroy(g->stream);
  cudaGetLastError();  // teardown errors are not recoverable; do not leave them for the next call
  *g = GpuContext{};
}

Status synchronize(GpuContext& g) {
  K3_CUDA_CHECK(cudaStreamSynchronize(g.stream));
  K3_CUDA_CHECK(cudaGetLastError());
  return {};
}

Status last_error() {
  K3_CUDA_CHECK(cudaGetLastError());
  return {};
}

Status malloc_device(void** ptr, size_t bytes) {
  *ptr = nullptr;
  const cudaError_t err = cudaMalloc(ptr, bytes ? bytes : 1);
  if (err != cudaSuccess) {
    cudaGetLastError();
    *ptr = nullptr;
    return Status(err == cudaErrorMemoryAllocation ? Code::out_of_memory : Code::internal,
                  "cudaMalloc of " + std::to_string(bytes) + " bytes failed: " + cudaGetErrorString(err));
  }
  return {};
}

void free_device(void* ptr) {
  if (ptr) cudaFree(ptr);
}

Status copy_to_device(void* dst, const void* src, size_t bytes, GpuContext& g) {
  if (bytes) K3_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, g.stream));
  return {};
}

Status copy_to_host(void* dst, const void* src, size_t bytes, GpuContext& g) {
  if (bytes) K3_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, g.stream));
  return {};
}

Status copy_on_device(void* dst, const void* src, size_t bytes, GpuContext& g) {
  if (bytes) K3_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, g.stream));
  return {};
}

Status memset_device(void* dst, int byte, size_t bytes, GpuContext& g) {
  if (bytes) K3_CUDA_CHECK(cudaMemsetAsync(dst, byte, bytes, g.stream));
  return {};
}

}  // namespace k3::gpu
