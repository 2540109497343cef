// layer_norm_ref.cpp: the plain reference for layer_norm.h (fp64 two-pass statistics, no SIMD).
#include <cmath>

#include "ops/layer_norm.h"

namespace k3 {

void layer_norm_ref(const LayerNormParams& p) {
  const int64_t ldx = p.ldx ? p.ldx : p.d, ldy = p.ldy ? p.ldy : p.d;
  for (int64_t t = 0; t < p.n_row; ++t) {
    const float* x = p.x + t * ldx;
    float* y = p.y + t * ldy;
    double mu = 0, var = 0;
    for (int64_t i = 0; i < p.d; ++i) mu += x[i];
    mu /= double(p.d);
    for (int64_t i = 0; i < p.d; ++i) var += (x[i] - mu) * (x[i] - mu);
    var /= double(p.d);
    const double r = 1.0 / std::sqrt(var + double(p.eps));
    for (int64_t i = 0; i < p.d; ++i)
      y[i] = float((x[i] - mu) * r * (p.gain ? p.gain[i] : 1.0) + (p.bias ? p.bias[i] : 0.0));
  }
}

}  // namespace k3
