// layer_norm_cpu.cpp: fast CPU LayerNorm (layer_norm.h): fp32 two-pass statistics with 16 partial sums,
// one body compiled for portable and AVX-512 (vec_math.h).
#include <cmath>

#include "core/cpu_features.h"
#include "core/thread_pool.h"
#include "ops/layer_norm.h"
#include "ops/vec_math.h"

namespace k3 {

namespace {

K3_OPS_INLINE float sum16(const float* acc) {
  float s = 0;
  for (int l = 0; l < 16; ++l) s += acc[l];
  return s;
}

K3_OPS_INLINE void rows_body(const LayerNormParams& p, int64_t r0, int64_t r1) {
  const int64_t ldx = p.ldx ? p.ldx : p.d, ldy = p.ldy ? p.ldy : p.d, d = p.d;
  for (int64_t t = r0; t < r1; ++t) {
    const float* x = p.x + t * ldx;
    float* y = p.y + t * ldy;
    float acc[16] = {};
    int64_t i = 0;
    for (; i + 16 <= d; i += 16)
      for (int l = 0; l < 16; ++l) acc[l] += x[i + l];
    for (; i < d; ++i) acc[i % 16] += x[i];
    const float mu = sum16(acc) / float(d);
    float acc2[16] = {};
    for (i = 0; i + 16 <= d; i += 16)
      for (int l = 0; l < 16; ++l) acc2[l] += (x[i + l] - mu) * (x[i + l] - mu);
    for (; i < d; ++i) acc2[i % 16] += (x[i] - mu) * (x[i] - mu);
    const float r = 1.0f / std::sqrt(sum16(acc2) / float(d) + p.eps);
    for (int64_t k = 0; k < d; ++k) {
      const float g = p.gain ? p.gain[k] : 1.0f, b = p.bias ? p.bias[k] : 0.0f;
      y[k] = (x[k] - mu) * r * g + b;
    }
  }
}

void rows_portable(const LayerNormParams& p, int64_t r0, int64_t r1) { rows_body(p, r0, r1); }
K3_OPS_AVX512 void rows_avx512(const LayerNormParams& p, int64_t r0, int64_t r1) { rows_body(p, r0, r1); }

}  // namespace

void layer_norm_cpu(const LayerNormParams& p, ThreadPool* pool) {
  auto* rows = cpu_level() >= CpuLevel::avx512 && K3_OPS_HAVE_AVX512 ? rows_avx512 : rows_portable;
  const bool big = p.n_row * p.d >= (1 << 15);
  parallel_for(big ? pool : nullptr, p.n_row, [&](int64_t b, int64_t e) { rows(p, b, e); });
}

}  // namespace k3
