// linear.h: y = W x for every weight dtype the checkpoints hold (MODEL.md §3, §9).
//
//   y[t, o] = sum_i x[t, i] * W[o, i]        x: [n_tok, in] fp32, y: [n_tok, out] fp32, fp32 accumulation
//
// W is bf16, f16, f32 or fp8 e4m3 [out, in], or MXFP4 (weight_packed u8 [out, in/2], low nibble = even
// column; weight_scale E8M0 [out, in/32]) decoded inside the inner loop, never expanded to a full copy.
// Rounding the output to bf16 (the model's rounding point) is the caller's business.
#pragma once

#include <cstdint>

#include "core/dtype.h"

namespace k3 {

class ThreadPool;

struct LinearWeight {
  DType dtype = DType::bf16;        // u8 means MXFP4 (packed) with `scale`
  int64_t out = 0, in = 0;
  const void* w = nullptr;          // [out, in] (MXFP4: [out, in/2] bytes)
  const uint8_t* scale = nullptr;   // MXFP4 only: [out, in/32] E8M0
  bool is_mxfp4() const { return scale != nullptr; }
};

// Plain reference: one output at a time, fp64 accumulation, weights decoded exactly.
void linear_ref(const LinearWeight& W, const float* x, float* y, int64_t n_tok);
// Fast CPU: blocked, SIMD (AVX-512 BF16 where present, detected at run time), threads over outputs.
void linear_cpu(const LinearWeight& W, const float* x, float* y, int64_t n_tok, ThreadPool* pool);

}  // namespace k3
