// rms_norm.h: RMSNorm over the last dimension (KimiRMSNorm, MODEL.md §3).
//
//   r    = rsqrt(mean_i(x[i]^2) + eps)                 fp32
//   fp32 mode:  y[i] = x[i] * r * w[i]
//   bf16 mode:  y[i] = bf16( bf16(x[i] * r) * w[i] )   the model's two rounding points
//
// x: [n_row, d] with row stride ldx; w: [d] plain weight (not 1 + w), nullptr means no weight;
// y: [n_row, d] with row stride ldy. In place is allowed (y == x, ldy == ldx). Rows split over threads.
#pragma once

#include <cstdint>

#include "core/gpu.h"

#include "ops/precision.h"

namespace k3 {

class ThreadPool;

struct RmsNormParams {
  int64_t n_row = 0, d = 0;
  const float* x = nullptr;  // [n_row, d], row stride ldx (0: d)
  int64_t ldx = 0;
  const float* w = nullptr;  // [d] or nullptr
  float* y = nullptr;        // [n_row, d], row stride ldy (0: d)
  int64_t ldy = 0;
  float eps = 1e-5f;
  Precision precision = Precision::bf16;
};

// Plain reference: fp64 sum of squares, r rounded to fp32, then the rounding points above.
void rms_norm_ref(const RmsNormParams& p);
// Fast CPU (AVX-512 when present, threads over rows when the pool is given and the work is large).
void rms_norm_cpu(const RmsNormParams& p, ThreadPool* pool);
// CUDA (core/gpu.h): device pointers, same contract.
void rms_norm_cuda(const RmsNormParams& p, GpuContext& g);

}  // namespace k3
