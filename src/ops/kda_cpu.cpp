// kda_cpu.cpp: fp32 KDA on the CPU, threads over heads (kda.h). The recurrent form serves decode and
// forced token-by-token runs; the chunkwise WY/UT form serves prefill. Inner loops run over contiguous
// K or V channels so the compiler can vectorize them.
#include <algorithm>
#include <cmath>
#include <vector>

#include "core/status.h"
#include "core/thread_pool.h"
#include "ops/kda.h"

#if defined(__x86_64__) || defined(__SSE__)
#include <xmmintrin.h>
#endif

namespace k3 {

namespace {

// Strong decays push exp(G) products into the subnormal range, where x86 arithmetic is ~100x slower.
// While a head runs, flush subnormals to zero (FTZ + DAZ in MXCSR of this thread), then restore.
struct FlushSubnormals {
#if defined(__x86_64__) || defined(__SSE__)
  unsigned saved = _mm_getcsr();
  FlushSubnormals() {
    _mm_setcsr(saved | 0x8040u);
  }
  ~FlushSubnormals() {
    _mm_setcsr(saved);
  }
#endif
};

void recurrent_head(const KdaParams& p, int h) {
  const int H = p.n_head, K = p.d_k, V = p.d_v;
  float* S = p.S + size_t(h) * K * V;  // [K, V]
  std::vector<float> u(V);
  for (int64_t t = 0; t < p.n_tok; ++t) {
    const float* q = p.q + (t * H + h) * K;
    const float* k = p.k + (t * H + h) * K;
    const float* v = p.v + (t * H + h) * V;
    const float* g = p.g + (t * H + h) * K;
    const float beta = p.beta[t * H + h];
    for (int b = 0; b < V; ++b) u[b] = 0.f;
    for (int a = 0; a < K; ++a) {  // decay, then u = S^T k
      const float alpha = std::exp(g[a]);
      float* row = S + size_t(a) * V;
      for (int b = 0; b < V; ++b) {
        row[b] *= alpha;
        u[b] += row[b] * k[a];
      }
    }
    for (int b = 0; b < V; ++b) u[b] = beta * (v[b] - u[b]);
    float* o = p.o + (t * H + h) * V;
    for (int b = 0; b < V; ++b) o[b] = 0.f;
    for (int a = 0; a < K; ++a) {  // S += k u^T, o = S^T q
      float* row = S + size_t(a) * V;
      for (int b = 0; b < V; ++b) {
        row[b] += k[a] * u[b];
        o[b] += row[b] * q[a];
      }
    }
  }
}

// exp(x) for x <= 0, flushed to 0 below -80 (e^-80 ~ 2e-35): keeps the chunk's decay products out of the
// subnormal range, where x86 arithmetic is ~100x slower. The flushed terms are below fp32 resolution of
// any non-negligible sum.
inline float exp_neg(float x) {
  return x < -80.f ? 0.f : std::exp(x);
}

inline float dot(const float* a, const float* b, int n) {
  float acc = 0.f;
  for (int d = 0; d < n; ++d) acc += a[d] * b[d];
  return acc;
}

// One head, chunk by chunk. The pairwise decays exp(G_i - G_j) (j <= i) are formed exactly inside each
// sub-block of kSub rows; across sub-blocks (j in b < a, i in a) they factor through the last row r of b:
// exp(G_i - G_r) * exp(G_r - G_j), both factors <= 1 because g <= 0, so nothing can overflow and an
// underflowing factor means an underflowing product. This keeps the exps at O(C K) per sub-block pair.
void chunk_head(const KdaParams& p, int h) {
  constexpr int kSub = 16;
  const int H = p.n_head, K = p.d_k, V = p.d_v, C = std::max(1, p.chunk);
  float* S = p.S + size_t(h) * K * V;  // [K, V]
  std::vector<float> Q(size_t(C) * K), Kc(size_t(C) * K), G(size_t(C) * K), Kr(size_t(C) * K),
      L(size_t(C) * C), A(size_t(C) * C), W(size_t(C) * K), U(size_t(C) * V), ql(size_t(kSub) * K),
      kl(size_t(kSub) * K), e(K);
  std::vector<float> beta(static_cast<size_t>(C));
  for (int64_t t0 = 0; t0 < p.n_tok; t0 += C) {
    const int n = int(std::min<int64_t>(C, p.n_tok - t0));
    for (int i = 0; i < n; ++i) {  // gather rows; G = in-chunk cumulative log-decay
      const int64_t r = (t0 + i) * H + h;
      std::copy_n(p.q + r * K, K, &Q[size_t(i) * K]);
      std::copy_n(p.k + r * K, K, &Kc[size_t(i) * K]);
      beta[size_t(i)] = p.beta[r];
      const float* g = p.g + r * K;
      for (int d = 0; d < K; ++d) G[size_t(i) * K + d] = (i ? G[size_t(i - 1) * K + d] : 0.f) + g[d];
    }
    const int n_sub = (n + kSub - 1) / kSub;
    for (int b = 0; b < n_sub;
         ++b) {  // right factors: Kr_j = k_j exp(G_r - G_j), r = last row of j's sub-block
      const int j0 = b * kSub, j1 = std::min(n, j0 + kSub);
      const float* Gr = &G[size_t(j1 - 1) * K];
      for (int j = j0; j < j1; ++j)
        for (int d = 0; d < K; ++d)
          Kr[size_t(j) * K + d] = Kc[size_t(j) * K + d] * exp_neg(Gr[d] - G[size_t(j) * K + d]);
    }
    // A[i,j] = sum_d q_id k_jd exp(G_id - G_jd) (j <= i);  L[i,j] = beta_i sum_d k_id k_jd exp(G_id - G_jd)
    // (j < i)
    for (int a = 0; a < n_sub; ++a) {
      const int i0 = a * kSub, i1 = std::min(n, i0 + kSub);
      for (int i = i0; i < i1; ++i) {
        const float* Gi = &G[size_t(i) * K];
        for (int j = i0; j <= i; ++j) {
          const float* Gj = &G[size_t(j) * K];
          const float* kj = &Kc[size_t(j) * K];
          for (int d = 0; d < K; ++d) e[size_t(d)] = kj[d] * exp_neg(Gi[d] - Gj[d]);
          A[size_t(i) * C + j] = dot(&Q[size_t(i) * K], e.data(), K);
          L[size_t(i) * C + j] = j < i ? beta[size_t(i)] * dot(&Kc[size_t(i) * K], e.data(), K) : 0.f;
        }
      }
      for (int b = 0; b < a; ++b) {
        const int j0 = b * kSub, j1 = j0 + kSub;
        const float* Gr = &G[size_t(j1 - 1) * K];
        for (int i = i0; i < i1; ++i) {
          float* qi = &ql[size_t(i - i0) * K];
          float* ki = &kl[size_t(i - i0) * K];
          const float* Gi = &G[size_t(i) * K];
          for (int d = 0; d < K; ++d) {
            const float f = exp_neg(Gi[d] - Gr[d]);
            qi[d] = Q[size_t(i) * K + d] * f;
            ki[d] = Kc[size_t(i) * K + d] * f;
          }
          for (int j = j0; j < j1; ++j) {
            A[size_t(i) * C + j] = dot(qi, &Kr[size_t(j) * K], K);
            L[size_t(i) * C + j] = beta[size_t(i)] * dot(ki, &Kr[size_t(j) * K], K);
          }
        }
      }
    }
    // W_i = beta_i exp(G_i).k_i - sum_{j<i} L_ij W_j;  U_i = beta_i v_i - sum_{j<i} L_ij U_j
    for (int i = 0; i < n; ++i) {
      const float bi = beta[size_t(i)];
      float* Wi = &W[size_t(i) * K];
      float* Ui = &U[size_t(i) * V];
      const float* vi = p.v + ((t0 + i) * H + h) * V;
      for (int d = 0; d < K; ++d) Wi[d] = bi * exp_neg(G[size_t(i) * K + d]) * Kc[size_t(i) * K + d];
      for (int c = 0; c < V; ++c) Ui[c] = bi * vi[c];
      for (int j = 0; j < i; ++j) {
        const float l = L[size_t(i) * C + j];
        const float* Wj = &W[size_t(j) * K];
        const float* Uj = &U[size_t(j) * V];
        for (int d = 0; d < K; ++d) Wi[d] -= l * Wj[d];
        for (int c = 0; c < V; ++c) Ui[c] -= l * Uj[c];
      }
    }
    // V' = U - W S (in place in U);  O_i = (exp(G_i).q_i) S + sum_{j<=i} A_ij V'_j
    for (int i = 0; i < n; ++i) {
      float* Ui = &U[size_t(i) * V];
      float* o = p.o + ((t0 + i) * H + h) * V;
      for (int c = 0; c < V; ++c) o[c] = 0.f;
      for (int a = 0; a < K; ++a) {
        const float w = W[size_t(i) * K + a];
        const float qa = exp_neg(G[size_t(i) * K + a]) * Q[size_t(i) * K + a];
        const float* Sa = S + size_t(a) * V;
        for (int c = 0; c < V; ++c) {
          Ui[c] -= w * Sa[c];
          o[c] += qa * Sa[c];
        }
      }
    }
    for (int i = 0; i < n; ++i) {
      float* o = p.o + ((t0 + i) * H + h) * V;
      for (int j = 0; j <= i; ++j) {
        const float Aij = A[size_t(i) * C + j];
        const float* Uj = &U[size_t(j) * V];
        for (int c = 0; c < V; ++c) o[c] += Aij * Uj[c];
      }
    }
    // S <- diag(exp(G_last)) S + (exp(G_last - G) . K)^T V'
    const float* Gl = &G[size_t(n - 1) * K];
    for (int a = 0; a < K; ++a) {
      float* Sa = S + size_t(a) * V;
      const float decay = exp_neg(Gl[a]);
      for (int c = 0; c < V; ++c) Sa[c] *= decay;
      for (int j = 0; j < n; ++j) {
        const float w = exp_neg(Gl[a] - G[size_t(j) * K + a]) * Kc[size_t(j) * K + a];
        const float* Uj = &U[size_t(j) * V];
        for (int c = 0; c < V; ++c) Sa[c] += w * Uj[c];
      }
    }
  }
}

}  // namespace

void kda_recurrent_cpu(const KdaParams& p, ThreadPool* pool) {
  K3_ASSERT(p.n_head > 0 && p.d_k > 0 && p.d_v > 0);
  parallel_for(pool, p.n_head, [&](int64_t h0, int64_t h1) {
    FlushSubnormals ftz;
    for (int64_t h = h0; h < h1; ++h) recurrent_head(p, int(h));
  });
}

void kda_chunk_cpu(const KdaParams& p, ThreadPool* pool) {
  K3_ASSERT(p.n_head > 0 && p.d_k > 0 && p.d_v > 0 && p.chunk > 0);
  parallel_for(pool, p.n_head, [&](int64_t h0, int64_t h1) {
    FlushSubnormals ftz;
    for (int64_t h = h0; h < h1; ++h) chunk_head(p, int(h));
  });
}

}  // namespace k3
