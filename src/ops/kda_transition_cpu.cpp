// kda_transition_cpu.cpp: (M, S~) of a KDA segment with the chunkwise KDA (kda_transition.h).
//
// The value columns of the recurrence are independent, so one run on values [v | 0] (width V + K) from the
// state [0 | I] ends in [S~ | M^(as columns)]: columns V.. hold M I = M.
#include <algorithm>
#include <vector>

#include "ops/kda.h"
#include "ops/kda_transition.h"

namespace k3 {

void kda_transition_cpu(const KdaTransitionParams& p, ThreadPool* pool) {
  const int H = p.n_head, K = p.d_k, V = p.d_v, W = V + K;
  const int64_t T = p.n_tok;
  std::vector<float> vw(size_t(T * H * W), 0.f), S(size_t(H) * K * W, 0.f), o(size_t(T * H * W)),
      q(size_t(T * H * K), 0.f);
  for (int64_t r = 0; r < T * H; ++r) std::copy_n(p.v + r * V, V, &vw[size_t(r * W)]);
  for (int h = 0; h < H; ++h)
    for (int a = 0; a < K; ++a) S[size_t((h * K + a) * W + V + a)] = 1.f;
  KdaParams kp;
  kp.n_tok = T, kp.n_head = H, kp.d_k = K, kp.d_v = W;
  kp.q = q.data(), kp.k = p.k, kp.v = vw.data(), kp.g = p.g, kp.beta = p.beta;
  kp.S = S.data(), kp.o = o.data(), kp.chunk = p.chunk;
  if (T > 0) kda_chunk_cpu(kp, pool);
  for (int h = 0; h < H; ++h)
    for (int a = 0; a < K; ++a) {
      const float* row = &S[size_t((h * K + a) * W)];
      std::copy_n(row, V, p.S + (size_t(h) * K + a) * V);
      std::copy_n(row + V, K, p.M + (size_t(h) * K + a) * K);
    }
}

void kda_transition_apply(const float* M, const float* S_tilde, int n_head, int d_k, int d_v, float* S) {
  const int K = d_k, V = d_v;
  std::vector<float> out(size_t(K) * V);
  for (int h = 0; h < n_head; ++h) {
    const float* Mh = M + size_t(h) * K * K;
    float* Sh = S + size_t(h) * K * V;
    const float* Th = S_tilde + size_t(h) * K * V;
    for (int a = 0; a < K; ++a) {
      float* o = &out[size_t(a) * V];
      std::copy_n(Th + size_t(a) * V, V, o);
      for (int c = 0; c < K; ++c) {
        const float m = Mh[size_t(a) * K + c];
        const float* s = Sh + size_t(c) * V;
        for (int b = 0; b < V; ++b) o[b] += m * s[b];
      }
    }
    std::copy(out.begin(), out.end(), Sh);
  }
}

}  // namespace k3
