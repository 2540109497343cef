// kda_ref.cpp: the KDA recurrence in fp64, one token at a time (fla naive_recurrent_kda). See kda.h.
#include <cmath>
#include <vector>

#include "ops/kda.h"

namespace k3 {

void kda_ref(const KdaParams& p) {
  const int H = p.n_head, K = p.d_k, V = p.d_v;
  std::vector<double> S(size_t(K) * V), u(V);
  for (int h = 0; h < H; ++h) {
    float* Sh = p.S + size_t(h) * K * V;
    for (size_t i = 0; i < S.size(); ++i) S[i] = Sh[i];
    for (int64_t t = 0; t < p.n_tok; ++t) {
      const float* q = p.q + (t * H + h) * K;
      const float* k = p.k + (t * H + h) * K;
      const float* v = p.v + (t * H + h) * V;
      const float* g = p.g + (t * H + h) * K;
      const double beta = p.beta[t * H + h];
      for (int a = 0; a < K; ++a) {
        const double alpha = std::exp(double(g[a]));
        for (int b = 0; b < V; ++b) S[size_t(a) * V + b] *= alpha;
      }
      for (int b = 0; b < V; ++b) {
        double pred = 0;
        for (int a = 0; a < K; ++a) pred += S[size_t(a) * V + b] * k[a];
        u[b] = beta * (v[b] - pred);
      }
      for (int a = 0; a < K; ++a)
        for (int b = 0; b < V; ++b) S[size_t(a) * V + b] += double(k[a]) * u[b];
      float* o = p.o + (t * H + h) * V;
      for (int b = 0; b < V; ++b) {
        double acc = 0;
        for (int a = 0; a < K; ++a) acc += S[size_t(a) * V + b] * q[a];
        o[b] = float(acc);
      }
    }
    for (size_t i = 0; i < S.size(); ++i) Sh[i] = float(S[i]);
  }
}

}  // namespace k3
