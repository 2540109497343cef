// kda_cpu.cpp: fp32 KDA on the CPU, threads over heads (kda.h). The recurrent form serves decode and
// forced token-by-token runs; the chunkwise WY/UT form serves prefill. Inner loops run over contiguous
// K or V channels so the compiler can vectorize them.
#include <algorithm>
#include <cmath>
#include <vector>

#include "core/status.h"
#include "core/thread_pool.h"
#include "ops/kda.h"

namespace k3 {

namespace {

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

void chunk_head(const KdaParams& p, int h) {
  const int H = p.n_head, K = p.d_k, V = p.d_v, C = std::max(1, p.chunk);
  float* S = p.S + size_t(h) * K * V;  // [K, V]
  std::vector<float> G(size_t(C) * K), L(size_t(C) * C), W(size_t(C) * K), U(size_t(C) * V);
  for (int64_t t0 = 0; t0 < p.n_tok; t0 += C) {
    const int n = int(std::min<int64_t>(C, p.n_tok - t0));
    auto row = [&](const float* base, int i, int w) { return base + ((t0 + i) * H + h) * w; };
    for (int i = 0; i < n; ++i) {  // G = in-chunk cumulative log-decay
      const float* g = row(p.g, i, K);
      for (int d = 0; d < K; ++d) G[size_t(i) * K + d] = (i ? G[size_t(i - 1) * K + d] : 0.f) + g[d];
    }
    // W_i = beta_i exp(G_i).k_i - sum_{j<i} L_ij W_j;  U_i = beta_i v_i - sum_{j<i} L_ij U_j
    for (int i = 0; i < n; ++i) {
      const float* ki = row(p.k, i, K);
      const float* Gi = &G[size_t(i) * K];
      const float beta = p.beta[(t0 + i) * H + h];
      for (int j = 0; j < i; ++j) {
        const float* kj = row(p.k, j, K);
        const float* Gj = &G[size_t(j) * K];
        float acc = 0.f;
        for (int d = 0; d < K; ++d) acc += ki[d] * kj[d] * std::exp(Gi[d] - Gj[d]);
        L[size_t(i) * C + j] = beta * acc;
      }
      float* Wi = &W[size_t(i) * K];
      float* Ui = &U[size_t(i) * V];
      const float* vi = row(p.v, i, V);
      for (int d = 0; d < K; ++d) Wi[d] = beta * std::exp(Gi[d]) * ki[d];
      for (int b = 0; b < V; ++b) Ui[b] = beta * vi[b];
      for (int j = 0; j < i; ++j) {
        const float l = L[size_t(i) * C + j];
        const float* Wj = &W[size_t(j) * K];
        const float* Uj = &U[size_t(j) * V];
        for (int d = 0; d < K; ++d) Wi[d] -= l * Wj[d];
        for (int b = 0; b < V; ++b) Ui[b] -= l * Uj[b];
      }
    }
    // V' = U - W S (in place in U)
    for (int i = 0; i < n; ++i) {
      float* Ui = &U[size_t(i) * V];
      const float* Wi = &W[size_t(i) * K];
      for (int a = 0; a < K; ++a) {
        const float w = Wi[a];
        const float* Sa = S + size_t(a) * V;
        for (int b = 0; b < V; ++b) Ui[b] -= w * Sa[b];
      }
    }
    // O_i = (exp(G_i).q_i) S + sum_{j<=i} A_ij V'_j
    for (int i = 0; i < n; ++i) {
      const float* qi = row(p.q, i, K);
      const float* Gi = &G[size_t(i) * K];
      float* o = p.o + ((t0 + i) * H + h) * V;
      for (int b = 0; b < V; ++b) o[b] = 0.f;
      for (int a = 0; a < K; ++a) {
        const float w = std::exp(Gi[a]) * qi[a];
        const float* Sa = S + size_t(a) * V;
        for (int b = 0; b < V; ++b) o[b] += w * Sa[b];
      }
      for (int j = 0; j <= i; ++j) {
        const float* kj = row(p.k, j, K);
        const float* Gj = &G[size_t(j) * K];
        float A = 0.f;
        for (int d = 0; d < K; ++d) A += qi[d] * kj[d] * std::exp(Gi[d] - Gj[d]);
        const float* Uj = &U[size_t(j) * V];
        for (int b = 0; b < V; ++b) o[b] += A * Uj[b];
      }
    }
    // S <- diag(exp(G_last)) S + (exp(G_last - G) . K)^T V'
    const float* Gl = &G[size_t(n - 1) * K];
    for (int a = 0; a < K; ++a) {
      float* Sa = S + size_t(a) * V;
      const float decay = std::exp(Gl[a]);
      for (int b = 0; b < V; ++b) Sa[b] *= decay;
      for (int j = 0; j < n; ++j) {
        const float w = std::exp(Gl[a] - G[size_t(j) * K + a]) * row(p.k, j, K)[a];
        const float* Uj = &U[size_t(j) * V];
        for (int b = 0; b < V; ++b) Sa[b] += w * Uj[b];
      }
    }
  }
}

}  // namespace

void kda_recurrent_cpu(const KdaParams& p, ThreadPool* pool) {
  K3_ASSERT(p.n_head > 0 && p.d_k > 0 && p.d_v > 0);
  parallel_for(pool, p.n_head, [&](int64_t h0, int64_t h1) {
    for (int64_t h = h0; h < h1; ++h) recurrent_head(p, int(h));
  });
}

void kda_chunk_cpu(const KdaParams& p, ThreadPool* pool) {
  K3_ASSERT(p.n_head > 0 && p.d_k > 0 && p.d_v > 0 && p.chunk > 0);
  parallel_for(pool, p.n_head, [&](int64_t h0, int64_t h1) {
    for (int64_t h = h0; h < h1; ++h) chunk_head(p, int(h));
  });
}

}  // namespace k3
