// precision.h: the numeric mode an op runs in, chosen by the caller and passed in each op's params.
//
//   Precision::fp32  every intermediate stays fp32 (the "exact" mode used to check the bf16 mode)
//   Precision::bf16  the model's rounding points are applied (MODEL.md §3): e.g. RMSNorm rounds x·r to
//                    bf16 before the weight multiply, a linear's output is rounded to bf16 by the caller.
//
// round_bf16_inplace(x, n): x[i] <- bf16(x[i]) (round to nearest even, NaN stays NaN), kept in fp32.
// It is how a caller marks a buffer "already bf16-rounded", which lets linear use the bf16 dot path.
#pragma once

#include <cstdint>

#include "core/dtype.h"

namespace k3 {

enum class Precision : uint8_t { fp32, bf16 };

inline const char* precision_name(Precision p) { return p == Precision::fp32 ? "fp32" : "bf16"; }

inline void round_bf16_inplace(float* x, int64_t n) {
  for (int64_t i = 0; i < n; ++i) x[i] = round_bf16(x[i]);
}

}  // namespace k3
