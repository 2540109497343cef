// layer_norm.h: LayerNorm over the last dimension with gain and bias, in fp32
// (the K3.1 DSA indexer k_norm, eps 1e-6, MODEL.md §6).
//
//   mu = mean_i x[i];   var = mean_i (x[i] - mu)^2
//   y[i] = (x[i] - mu) * rsqrt(var + eps) * gain[i] + bias[i]
//
// x: [n_row, d] with row stride ldx; gain, bias: [d] or nullptr (1 and 0); y: [n_row, d] with stride ldy.
// In place is allowed (y == x, ldy == ldx). Rows split over threads.
#pragma once

#include <cstdint>

#include "core/gpu.h"

namespace k3 {

class ThreadPool;

struct LayerNormParams {
  int64_t n_row = 0, d = 0;
  const float* x = nullptr;     // [n_row, d], row stride ldx (0: d)
  int64_t ldx = 0;
  const float* gain = nullptr;  // [d] or nullptr
  const float* bias = nullptr;  // [d] or nullptr
  float* y = nullptr;           // [n_row, d], row stride ldy (0: d)
  int64_t ldy = 0;
  float eps = 1e-6f;
};

// Plain reference: fp64 mean and variance (two passes).
void layer_norm_ref(const LayerNormParams& p);
void layer_norm_cpu(const LayerNormParams& p, ThreadPool* pool);
// CUDA (core/gpu.h): device pointers, same contract.
void layer_norm_cuda(const LayerNormParams& p, GpuContext& g);

}  // namespace k3
