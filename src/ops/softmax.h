// softmax.h: numerically stable softmax over each row, in fp32 (MODEL.md §3: softmax runs in fp32).
//
//   z[i] = scale * x[i];   m = max_i z[i];   y[i] = exp(z[i] - m) / sum_j exp(z[j] - m)
//
// Entries equal to -inf (masked) get 0; a row with every entry -inf gives NaN (0/0), as the math does.
// x: [n_row, n] with row stride ldx; y: [n_row, n] with row stride ldy; in place allowed.
#pragma once

#include <cstdint>

#include "core/gpu.h"

namespace k3 {

class ThreadPool;

struct SoftmaxParams {
  int64_t n_row = 0, n = 0;
  const float* x = nullptr;  // [n_row, n], row stride ldx (0: n)
  int64_t ldx = 0;
  float* y = nullptr;        // [n_row, n], row stride ldy (0: n)
  int64_t ldy = 0;
  float scale = 1.0f;
};

// Plain reference: fp64 exp and sum.
void softmax_ref(const SoftmaxParams& p);
void softmax_cpu(const SoftmaxParams& p, ThreadPool* pool);
// CUDA (core/gpu.h): device pointers, same contract.
void softmax_cuda(const SoftmaxParams& p, GpuContext& g);

}  // namespace k3
