// common.h: what every model block shares (MODEL.md §3): the per-call context, the bf16 rounding
// point, RMSNorm / LayerNorm / l2norm as the model uses them, the linear call and the trace hook.
//
//   rnd(x)          bf16 mode: x <- bf16(x) (a rounding point); fp32 mode: nothing
//   rms_norm        y = bf16(x * rsqrt(mean(x^2) + eps)) * w, product rounded      (KimiRMSNorm, plain w)
//   layer_norm      y = (x - mean) * rsqrt(var + eps) * w + b, fp32, biased var     (DSA index key)
//   linear          y[n_tok, out] = x[n_tok, in] W^T, fp32 accumulation; bf16 mode rounds y
//
// Activations are fp32 in memory in both modes; in bf16 mode they hold bf16-representable values at
// MODEL.md's rounding points. `Ctx` carries no per-sequence state: it is built once per forward call.
#pragma once

#include <cmath>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "core/status.h"
#include "ops/linear.h"
#include "ops/precision.h"

namespace k3 {

class ThreadPool;
class ParallelHooks;

using TraceFn = std::function<void(const char* name, int layer, const float* data, int64_t n)>;

struct Ctx {
  Precision prec = Precision::fp32;
  ThreadPool* pool = nullptr;
  const TraceFn* trace = nullptr;  // optional: named intermediates per layer
  Status* guard = nullptr;         // debug builds: first non-finite activation found (layer + name)
  ParallelHooks* par = nullptr;    // parallel layout (model/parallel.h); nullptr: one rank

  bool bf16() const { return prec == Precision::bf16; }
  bool tracing() const { return trace && *trace; }
  void rnd(float* x, int64_t n) const {
    if (bf16()) round_bf16_inplace(x, n);
  }
  // cb(cur, "attn_norm", il): hands an intermediate to the trace hook; checks it in debug builds.
  void cb(const char* name, int layer, const float* x, int64_t n) const;
};

inline float sigmoidf(float x) {
  return 1.f / (1.f + std::exp(-x));
}
inline float siluf(float x) {
  return x / (1.f + std::exp(-x));
}

// x, y: [n_tok, d]; w: [d] fp32 (bf16 values in a bf16 checkpoint). y may alias x.
void rms_norm(const Ctx& c, const float* x, const float* w, float eps, int64_t n_tok, int64_t d, float* y);
// fp32 LayerNorm with gain and bias; y may alias x. No rounding (the caller rounds).
void layer_norm(const float* x, const float* w, const float* b, float eps, int64_t n_tok, int64_t d,
                float* y);
// x: [n, d] in place: x <- x / sqrt(sum(x^2) + eps) * scale.
void l2norm_scaled(float* x, int64_t n, int64_t d, float eps, float scale);

// y = W x for n_tok rows, then the bf16 rounding point. y is resized to [n_tok, W.out].
void linear(const Ctx& c, const LinearWeight& W, const float* x, int64_t n_tok, std::vector<float>& y);
// The same, into a caller-provided buffer [n_tok, W.out]; `round` false keeps the fp32 output. In bf16 mode
// x must hold bf16-rounded values (the bf16 dot path is used) unless `x_exact` is set.
void linear_into(const Ctx& c, const LinearWeight& W, const float* x, int64_t n_tok, float* y,
                 bool round = true, bool x_exact = false);
// linear_into for a weight that may be a row-parallel shard: the fp32 output is reduced over ranks by
// Ctx::par before the rounding point. Equals linear_into on one rank.
void linear_rowpar(const Ctx& c, const LinearWeight& W, const float* x, int64_t n_tok, float* y);

}  // namespace k3
