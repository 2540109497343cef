// rms_norm_cpu.cpp: fast CPU RMSNorm (rms_norm.h). One loop body compiled twice (portable, AVX-512,
// vec_math.h); 16 partial sums of x^2 so the reduction vectorizes without -ffast-math.
#include <cmath>

#include "core/cpu_features.h"
#include "core/thread_pool.h"
#include "ops/rms_norm.h"
#include "ops/vec_math.h"

namespace k3 {

namespace {

using namespace vecmath;

K3_OPS_INLINE void rows_body(const RmsNormParams& p, int64_t r0, int64_t r1) {
  const int64_t ldx = p.ldx ? p.ldx : p.d, ldy = p.ldy ? p.ldy : p.d, d = p.d;
  const bool bf16 = p.precision == Precision::bf16;
  for (int64_t t = r0; t < r1; ++t) {
    const float* x = p.x + t * ldx;
    float* y = p.y + t * ldy;
    float acc[16] = {};
    int64_t i = 0;
    for (; i + 16 <= d; i += 16)
      for (int l = 0; l < 16; ++l) acc[l] += x[i + l] * x[i + l];
    for (; i < d; ++i) acc[i % 16] += x[i] * x[i];
    float ss = 0;
    for (int l = 0; l < 16; ++l) ss += acc[l];
    const float r = 1.0f / std::sqrt(ss / float(d) + p.eps);
    if (bf16 && p.w) {
      for (int64_t k = 0; k < d; ++k) y[k] = round_bf16_fast(round_bf16_fast(x[k] * r) * p.w[k]);
    } else if (bf16) {
      for (int64_t k = 0; k < d; ++k) y[k] = round_bf16_fast(x[k] * r);
    } else if (p.w) {
      for (int64_t k = 0; k < d; ++k) y[k] = x[k] * r * p.w[k];
    } else {
      for (int64_t k = 0; k < d; ++k) y[k] = x[k] * r;
    }
  }
}

void rows_portable(const RmsNormParams& p, int64_t r0, int64_t r1) { rows_body(p, r0, r1); }
K3_OPS_AVX512 void rows_avx512(const RmsNormParams& p, int64_t r0, int64_t r1) { rows_body(p, r0, r1); }

}  // namespace

void rms_norm_cpu(const RmsNormParams& p, ThreadPool* pool) {
  auto* rows = cpu_level() >= CpuLevel::avx512 && K3_OPS_HAVE_AVX512 ? rows_avx512 : rows_portable;
  const bool big = p.n_row * p.d >= (1 << 15);
  parallel_for(big ? pool : nullptr, p.n_row, [&](int64_t b, int64_t e) { rows(p, b, e); });
}

}  // namespace k3
