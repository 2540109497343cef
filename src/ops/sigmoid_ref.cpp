// sigmoid_ref.cpp: the plain reference for sigmoid.h (fp64 exp).
#include <cmath>

#include "ops/sigmoid.h"

namespace k3 {

void sigmoid_ref(const SigmoidParams& p) {
  const int64_t ldx = p.ldx ? p.ldx : p.d, ldy = p.ldy ? p.ldy : p.d;
  for (int64_t t = 0; t < p.n_row; ++t)
    for (int64_t i = 0; i < p.d; ++i) p.y[t * ldy + i] = float(1.0 / (1.0 + std::exp(-double(p.x[t * ldx + i]))));
}

}  // namespace k3
