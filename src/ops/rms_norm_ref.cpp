// rms_norm_ref.cpp: the plain reference for rms_norm.h (one row at a time, fp64 sum, no SIMD).
#include <cmath>

#include "ops/rms_norm.h"

namespace k3 {

void rms_norm_ref(const RmsNormParams& p) {
  const int64_t ldx = p.ldx ? p.ldx : p.d, ldy = p.ldy ? p.ldy : p.d;
  for (int64_t t = 0; t < p.n_row; ++t) {
    const float* x = p.x + t * ldx;
    float* y = p.y + t * ldy;
    double ss = 0;
    for (int64_t i = 0; i < p.d; ++i) ss += double(x[i]) * x[i];
    const float r = float(1.0 / std::sqrt(ss / double(p.d) + double(p.eps)));
    for (int64_t i = 0; i < p.d; ++i) {
      const float w = p.w ? p.w[i] : 1.0f;
      if (p.precision == Precision::bf16) {
        const float xr = round_bf16(x[i] * r);
        y[i] = p.w ? round_bf16(xr * w) : xr;
      } else {
        y[i] = x[i] * r * w;
      }
    }
  }
}

}  // namespace k3
