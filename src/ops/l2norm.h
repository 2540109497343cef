// l2norm.h: L2 normalization per head, then a scale (KDA q and k, MODEL.md §4 step 3), in fp32.
//
//   y[h, i] = x[h, i] / sqrt( sum_j x[h, j]^2 + eps ) * scale        eps inside the sqrt (1e-6)
//
// x: [n_row, n_head * d_head] with row stride ldx; y likewise with ldy. KDA: q uses scale = d_head^-1/2,
// k uses 1. In place is allowed (y == x, ldy == ldx). Rows split over threads.
#pragma once

#include <cstdint>

#include "core/gpu.h"

namespace k3 {

class ThreadPool;

struct L2NormParams {
  int64_t n_row = 0, n_head = 0, d_head = 0;
  const float* x = nullptr;  // [n_row, n_head * d_head], row stride ldx (0: n_head * d_head)
  int64_t ldx = 0;
  float* y = nullptr;        // [n_row, n_head * d_head], row stride ldy (0: n_head * d_head)
  int64_t ldy = 0;
  float eps = 1e-6f;
  float scale = 1.0f;
};

void l2norm_ref(const L2NormParams& p);
void l2norm_cpu(const L2NormParams& p, ThreadPool* pool);
// CUDA (core/gpu.h): device pointers, same contract.
void l2norm_cuda(const L2NormParams& p, GpuContext& g);

}  // namespace k3
