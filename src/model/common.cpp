// common.cpp: shared model helpers (common.h).
#include "model/common.h"

#include <cmath>
#include <cstdio>

#include "core/thread_pool.h"
#include "model/parallel.h"

namespace k3 {

void Ctx::cb(const char* name, int layer, const float* x, int64_t n) const {
  if (trace && *trace) (*trace)(name, layer, x, n);
#ifndef NDEBUG
  if (guard && guard->ok()) {
    for (int64_t i = 0; i < n; ++i) {
      if (!std::isfinite(x[i])) {
        char buf[160];
        std::snprintf(buf, sizeof buf, "non-finite activation in layer %d tensor '%s' at element %lld", layer,
                      name, (long long)i);
        *guard = error(Code::internal, buf);
        break;
      }
    }
  }
#endif
}

void rms_norm(const Ctx& c, const float* x, const float* w, float eps, int64_t n_tok, int64_t d, float* y) {
  for (int64_t t = 0; t < n_tok; ++t) {
    const float* xt = x + t * d;
    float* yt = y + t * d;
    float ss = 0.f;
    for (int64_t i = 0; i < d; ++i) ss += xt[i] * xt[i];
    const float r = 1.f / std::sqrt(ss / float(d) + eps);
    if (c.bf16()) {
      for (int64_t i = 0; i < d; ++i) yt[i] = round_bf16(round_bf16(xt[i] * r) * w[i]);
    } else {
      for (int64_t i = 0; i < d; ++i) yt[i] = xt[i] * r * w[i];
    }
  }
}

void layer_norm(const float* x, const float* w, const float* b, float eps, int64_t n_tok, int64_t d,
                float* y) {
  for (int64_t t = 0; t < n_tok; ++t) {
    const float* xt = x + t * d;
    float* yt = y + t * d;
    float mean = 0.f;
    for (int64_t i = 0; i < d; ++i) mean += xt[i];
    mean /= float(d);
    float var = 0.f;
    for (int64_t i = 0; i < d; ++i) var += (xt[i] - mean) * (xt[i] - mean);
    var /= float(d);
    const float r = 1.f / std::sqrt(var + eps);
    for (int64_t i = 0; i < d; ++i) yt[i] = (xt[i] - mean) * r * w[i] + b[i];
  }
}

void l2norm_scaled(float* x, int64_t n, int64_t d, float eps, float scale) {
  for (int64_t t = 0; t < n; ++t) {
    float* xt = x + t * d;
    float ss = 0.f;
    for (int64_t i = 0; i < d; ++i) ss += xt[i] * xt[i];
    const float r = scale / std::sqrt(ss + eps);
    for (int64_t i = 0; i < d; ++i) xt[i] *= r;
  }
}

void linear_into(const Ctx& c, const LinearWeight& W, const float* x, int64_t n_tok, float* y, bool round,
                 bool x_exact) {
  if (n_tok <= 0) return;
  LinearParams p;
  p.n_tok = n_tok;
  p.x = x;
  p.y = y;
  p.x_precision = x_exact ? Precision::fp32 : c.prec;
  linear_cpu(W, p, c.pool);
  if (round) c.rnd(y, n_tok * W.out);
}

void linear_rowpar(const Ctx& c, const LinearWeight& W, const float* x, int64_t n_tok, float* y) {
  linear_into(c, W, x, n_tok, y, /*round=*/false);
  if (c.par) c.par->reduce_partial(c, y, n_tok * W.out);
  c.rnd(y, n_tok * W.out);
}

void linear(const Ctx& c, const LinearWeight& W, const float* x, int64_t n_tok, std::vector<float>& y) {
  y.resize(size_t(n_tok * W.out));
  linear_into(c, W, x, n_tok, y.data());
}

}  // namespace k3
