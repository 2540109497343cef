// kda_transition_ref.cpp: (M, S~) of a KDA segment in fp64, one token at a time (kda_transition.h).
#include <cmath>
#include <vector>

#include "ops/kda_transition.h"

namespace k3 {

void kda_transition_ref(const KdaTransitionParams& p) {
  const int H = p.n_head, K = p.d_k, V = p.d_v;
  for (int h = 0; h < H; ++h) {
    // X = [M | S~] [K, K + V], from [I | 0]; X <- (I - beta k k^T) diag(exp(g)) X + beta k [0 | v]^T
    const int W = K + V;
    std::vector<double> X(size_t(K) * W, 0.0), kX(static_cast<size_t>(W));
    for (int a = 0; a < K; ++a) X[size_t(a) * W + a] = 1.0;
    for (int64_t t = 0; t < p.n_tok; ++t) {
      const float* k = p.k + (t * H + h) * K;
      const float* v = p.v + (t * H + h) * V;
      const float* g = p.g + (t * H + h) * K;
      const double beta = p.beta[t * H + h];
      for (int a = 0; a < K; ++a) {
        const double alpha = std::exp(double(g[a]));
        for (int b = 0; b < W; ++b) X[size_t(a) * W + b] *= alpha;
      }
      for (int b = 0; b < W; ++b) {
        double acc = 0;
        for (int a = 0; a < K; ++a) acc += double(k[a]) * X[size_t(a) * W + b];
        kX[size_t(b)] = acc;
      }
      for (int a = 0; a < K; ++a)
        for (int b = 0; b < W; ++b) {
          const double vb = b < K ? 0.0 : double(v[b - K]);
          X[size_t(a) * W + b] += beta * double(k[a]) * (vb - kX[size_t(b)]);
        }
    }
    float* M = p.M + size_t(h) * K * K;
    float* S = p.S + size_t(h) * K * V;
    for (int a = 0; a < K; ++a) {
      for (int b = 0; b < K; ++b) M[size_t(a) * K + b] = float(X[size_t(a) * W + b]);
      for (int b = 0; b < V; ++b) S[size_t(a) * V + b] = float(X[size_t(a) * W + K + b]);
    }
  }
}

}  // namespace k3
