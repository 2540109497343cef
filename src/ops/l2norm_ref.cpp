// l2norm_ref.cpp: the plain reference for l2norm.h (fp64 sum of squares per head).
#include <cmath>

#include "ops/l2norm.h"

namespace k3 {

void l2norm_ref(const L2NormParams& p) {
  const int64_t width = p.n_head * p.d_head;
  const int64_t ldx = p.ldx ? p.ldx : width, ldy = p.ldy ? p.ldy : width;
  for (int64_t t = 0; t < p.n_row; ++t)
    for (int64_t h = 0; h < p.n_head; ++h) {
      const float* x = p.x + t * ldx + h * p.d_head;
      float* y = p.y + t * ldy + h * p.d_head;
      double ss = 0;
      for (int64_t i = 0; i < p.d_head; ++i) ss += double(x[i]) * x[i];
      const double f = double(p.scale) / std::sqrt(ss + double(p.eps));
      for (int64_t i = 0; i < p.d_head; ++i) y[i] = float(x[i] * f);
    }
}

}  // namespace k3
