// sigmoid.h: elementwise logistic sigmoid in fp32 (KDA beta = sigmoid(b_proj x), MODEL.md §4 step 4;
// router scores, §8.2). The result stays fp32 (beta is never rounded to bf16).
//
//   y[t, i] = 1 / (1 + exp(-x[t, i]))
//
// x: [n_row, d] with row stride ldx; y: [n_row, d] with row stride ldy; in place allowed.
#pragma once

#include <cstdint>

#include "core/gpu.h"

namespace k3 {

class ThreadPool;

struct SigmoidParams {
  int64_t n_row = 0, d = 0;
  const float* x = nullptr;  // [n_row, d], row stride ldx (0: d)
  int64_t ldx = 0;
  float* y = nullptr;        // [n_row, d], row stride ldy (0: d)
  int64_t ldy = 0;
};

void sigmoid_ref(const SigmoidParams& p);
void sigmoid_cpu(const SigmoidParams& p, ThreadPool* pool);
// CUDA (core/gpu.h): device pointers, same contract.
void sigmoid_cuda(const SigmoidParams& p, GpuContext& g);

}  // namespace k3
