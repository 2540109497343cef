// glu_ref.cpp: the plain reference for glu.h (fp64 math per element).
#include <cmath>

#include "ops/glu.h"

namespace k3 {

void glu_ref(const GluParams& p) {
  const int64_t ldg = p.ldg ? p.ldg : p.d, ldu = p.ldu ? p.ldu : p.d, ldh = p.ldh ? p.ldh : p.d;
  for (int64_t t = 0; t < p.n_tok; ++t)
    for (int64_t i = 0; i < p.d; ++i) {
      const double g = p.g[t * ldg + i], u = p.u[t * ldu + i];
      const double sig = 1.0 / (1.0 + std::exp(-g));
      double h;
      if (p.kind == GluKind::silu) {
        h = g * sig * u;
      } else {
        const double a = p.beta1 * std::tanh(g / p.beta1) * sig;
        const double b = p.beta2 > 0 ? p.beta2 * std::tanh(u / p.beta2) : u;
        h = a * b;
      }
      p.h[t * ldh + i] = p.precision == Precision::bf16 ? round_bf16(float(h)) : float(h);
    }
}

}  // namespace k3
