// cuda_bench_util.cuh: what the standalone CUDA benches (mla_cuda, dsa_cuda, moe_cuda) share: CUDA error
// check, the JSON-line emitter (bench/results/<bench>.jsonl fields), a bf16 random fill and the two ceilings
// of every ratio (copy bandwidth, bf16 GEMM rate). Header-only, one bench per binary; set g_bench in main.
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "core/gpu.h"

#define CK(call)                                                                                          \
  do {                                                                                                    \
    cudaError_t e_ = (call);                                                                              \
    if (e_ != cudaSuccess) {                                                                              \
      std::fprintf(stderr, "%s failed: %s (%s:%d)\n", #call, cudaGetErrorString(e_), __FILE__, __LINE__); \
      std::exit(1);                                                                                       \
    }                                                                                                     \
  } while (0)

inline std::string g_bench = "mla_cuda", g_out, g_commit = "unknown", g_machine = "NVIDIA H200";
inline int g_fail = 0;

// One JSON line: ratio = value / peer_value when a peer is given; met is reported only with a goal.
inline void emit_met(const std::string& metric, double value, const std::string& unit, const char* peer,
                     double peer_value, const char* goal, bool met) {
  char line[1024];
  const double ratio = peer ? value / peer_value : 0;
  std::snprintf(line, sizeof line,
                "{\"bench\": \"%s\", \"commit\": \"%s\", \"machine\": \"%s\", \"metric\": \"%s\", "
                "\"value\": %.6g, \"unit\": \"%s\", \"peer\": %s%s%s, \"peer_value\": %s, \"ratio\": %s, "
                "\"goal\": %s%s%s, \"met\": %s}",
                g_bench.c_str(), g_commit.c_str(), g_machine.c_str(), metric.c_str(), value, unit.c_str(),
                peer ? "\"" : "", peer ? peer : "null", peer ? "\"" : "",
                peer ? std::to_string(peer_value).c_str() : "null",
                peer ? std::to_string(ratio).c_str() : "null", goal ? "\"" : "", goal ? goal : "null",
                goal ? "\"" : "", goal ? (met ? "true" : "false") : "null");
  std::printf("%s\n", line);
  std::fflush(stdout);
  if (!g_out.empty())
    if (FILE* f = std::fopen(g_out.c_str(), "a")) std::fprintf(f, "%s\n", line), std::fclose(f);
}

// As emit_met, with met = (ratio >= goal_ratio).
inline void emit(const std::string& metric, double value, const std::string& unit, const char* peer = nullptr,
                 double peer_value = 0, const char* goal = nullptr, double goal_ratio = 0) {
  const double ratio = peer ? value / peer_value : 0;
  emit_met(metric, value, unit, peer, peer_value, goal, ratio >= goal_ratio);
}

static __global__ void gpu_sleep(unsigned ns) {  // keeps the GPU busy while the host enqueues what follows
  for (unsigned t = 0; t < ns; t += 1000) __nanosleep(1000);
}

// Device time of one call of f (us) as a decode step's CUDA graph pays it: f(0) .. f(calls - 1) captured in
// one graph on g.stream, median of `reps` launches after 2 warm-ups, divided by calls. f(0) runs once first,
// eagerly, so one-time setup (function attributes) stays out of the capture. Every launch is queued behind
// a 50 us sleep kernel, so the host's graph-launch latency is not inside the events either.
template <class F>
double graph_us(k3::GpuContext& g, F&& f, int calls = 16, int reps = 11) {
  f(0);
  CK(cudaStreamSynchronize(g.stream));
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  CK(cudaStreamBeginCapture(g.stream, cudaStreamCaptureModeThreadLocal));
  for (int i = 0; i < calls; ++i) f(i);
  CK(cudaStreamEndCapture(g.stream, &graph));
  CK(cudaGraphInstantiate(&exec, graph, 0));
  cudaEvent_t a, b;
  CK(cudaEventCreate(&a));
  CK(cudaEventCreate(&b));
  std::vector<float> ms;
  for (int i = 0; i < reps + 2; ++i) {
    gpu_sleep<<<1, 1, 0, g.stream>>>(50000);
    CK(cudaEventRecord(a, g.stream));
    CK(cudaGraphLaunch(exec, g.stream));
    CK(cudaEventRecord(b, g.stream));
    CK(cudaEventSynchronize(b));
    float t = 0;
    CK(cudaEventElapsedTime(&t, a, b));
    if (i >= 2) ms.push_back(t);
  }
  CK(cudaGetLastError());
  CK(cudaGraphExecDestroy(exec));
  CK(cudaGraphDestroy(graph));
  CK(cudaEventDestroy(a));
  CK(cudaEventDestroy(b));
  std::sort(ms.begin(), ms.end());
  return double(ms[ms.size() / 2]) * 1e3 / calls;
}

static __global__ void fill_bf16(uint16_t* x, size_t n, uint64_t seed) {  // uniform(-1.7, 1.7) in bf16
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    uint64_t h = (i + 1) * 0x9E3779B97F4A7C15ull ^ seed;
    h ^= h >> 31, h *= 0xBF58476D1CE4E5B9ull, h ^= h >> 29;
    const float u = float(h >> 40) * (1.f / 16777216.f) * 3.4f - 1.7f;
    const uint32_t b = __float_as_uint(u);
    x[i] = uint16_t((b + 0x7FFFu + ((b >> 16) & 1u)) >> 16);
  }
}

// bf16 GEMM rate (TFLOP/s): C (fp32) = A B, 8192^3, random bf16 inputs, median of 10 after 3 warm-ups.
inline double gemm_tflops(k3::GpuContext& g) {
  const int n = 8192;
  uint16_t *a, *b;
  float* c;
  CK(cudaMalloc(&a, size_t(n) * n * 2));
  CK(cudaMalloc(&b, size_t(n) * n * 2));
  CK(cudaMalloc(&c, size_t(n) * n * 4));
  fill_bf16<<<1024, 256>>>(a, size_t(n) * n, 11);
  fill_bf16<<<1024, 256>>>(b, size_t(n) * n, 12);
  cublasHandle_t h;
  if (cublasCreate(&h) != CUBLAS_STATUS_SUCCESS) return 0;
  cublasSetStream(h, g.stream);
  const float one = 1.f, zero = 0.f;
  auto run = [&] {
    return cublasGemmEx(h, CUBLAS_OP_N, CUBLAS_OP_N, n, n, n, &one, a, CUDA_R_16BF, n, b, CUDA_R_16BF, n,
                        &zero, c, CUDA_R_32F, n, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
  };
  std::vector<float> ms(10);
  cudaEvent_t e0, e1;
  CK(cudaEventCreate(&e0));
  CK(cudaEventCreate(&e1));
  bool ok = true;
  for (int i = 0; i < 3; ++i) ok = ok && run() == CUBLAS_STATUS_SUCCESS;
  for (auto& m : ms) {
    CK(cudaEventRecord(e0, g.stream));
    ok = ok && run() == CUBLAS_STATUS_SUCCESS;
    CK(cudaEventRecord(e1, g.stream));
    CK(cudaEventSynchronize(e1));
    CK(cudaEventElapsedTime(&m, e0, e1));
  }
  std::sort(ms.begin(), ms.end());
  cublasDestroy(h);
  CK(cudaFree(a));
  CK(cudaFree(b));
  CK(cudaFree(c));
  if (!ok) return 0;
  const double tflops = 2.0 * n * double(n) * n / (ms[5] * 1e-3) * 1e-12;
  emit("gemm_bf16_TFLOPs", tflops, "TFLOP/s");
  return tflops;
}

inline double copy_bandwidth(k3::GpuContext& g) {
  const size_t n = size_t(2) << 30;
  char *a, *b;
  CK(cudaMalloc(&a, n));
  CK(cudaMalloc(&b, n));
  CK(cudaMemset(a, 1, n));
  for (int i = 0; i < 2; ++i) CK(cudaMemcpyAsync(b, a, n, cudaMemcpyDeviceToDevice, g.stream));
  cudaEvent_t e0, e1;
  CK(cudaEventCreate(&e0));
  CK(cudaEventCreate(&e1));
  CK(cudaEventRecord(e0, g.stream));
  for (int i = 0; i < 10; ++i) CK(cudaMemcpyAsync(b, a, n, cudaMemcpyDeviceToDevice, g.stream));
  CK(cudaEventRecord(e1, g.stream));
  CK(cudaEventSynchronize(e1));
  float ms = 0;
  CK(cudaEventElapsedTime(&ms, e0, e1));
  CK(cudaFree(a));
  CK(cudaFree(b));
  const double gbps = 2.0 * double(n) * 10 / (ms * 1e-3) * 1e-9;
  emit("copy_GBps", gbps, "GB/s");
  return gbps;
}
