// softmax_ref.cpp: the plain reference for softmax.h (fp64 exp and sum, three passes per row).
#include <cmath>

#include "ops/softmax.h"

namespace k3 {

void softmax_ref(const SoftmaxParams& p) {
  const int64_t ldx = p.ldx ? p.ldx : p.n, ldy = p.ldy ? p.ldy : p.n;
  for (int64_t t = 0; t < p.n_row; ++t) {
    const float* x = p.x + t * ldx;
    float* y = p.y + t * ldy;
    double m = -INFINITY;
    for (int64_t i = 0; i < p.n; ++i) m = std::fmax(m, double(p.scale) * x[i]);
    double sum = 0;
    for (int64_t i = 0; i < p.n; ++i) sum += std::exp(double(p.scale) * x[i] - m);
    for (int64_t i = 0; i < p.n; ++i) y[i] = float(std::exp(double(p.scale) * x[i] - m) / sum);
  }
}

}  // namespace k3
