// l2norm_cpu.cpp: fast CPU per-head L2 norm (l2norm.h), one body for portable and AVX-512 (vec_math.h).
#include <cmath>

#include "core/cpu_features.h"
#include "core/thread_pool.h"
#include "ops/l2norm.h"
#include "ops/vec_math.h"

namespace k3 {

namespace {

K3_OPS_INLINE void rows_body(const L2NormParams& p, int64_t r0, int64_t r1) {
  const int64_t width = p.n_head * p.d_head, dh = p.d_head;
  const int64_t ldx = p.ldx ? p.ldx : width, ldy = p.ldy ? p.ldy : width;
  for (int64_t t = r0; t < r1; ++t)
    for (int64_t h = 0; h < p.n_head; ++h) {
      const float* x = p.x + t * ldx + h * dh;
      float* y = p.y + t * ldy + h * dh;
      float acc[16] = {};
      int64_t i = 0;
      for (; i + 16 <= dh; i += 16)
        for (int l = 0; l < 16; ++l) acc[l] += x[i + l] * x[i + l];
      for (; i < dh; ++i) acc[i % 16] += x[i] * x[i];
      float ss = 0;
      for (int l = 0; l < 16; ++l) ss += acc[l];
      const float f = p.scale / std::sqrt(ss + p.eps);
      for (int64_t k = 0; k < dh; ++k) y[k] = x[k] * f;
    }
}

void rows_portable(const L2NormParams& p, int64_t r0, int64_t r1) { rows_body(p, r0, r1); }
K3_OPS_AVX512 void rows_avx512(const L2NormParams& p, int64_t r0, int64_t r1) { rows_body(p, r0, r1); }

}  // namespace

void l2norm_cpu(const L2NormParams& p, ThreadPool* pool) {
  auto* rows = cpu_level() >= CpuLevel::avx512 && K3_OPS_HAVE_AVX512 ? rows_avx512 : rows_portable;
  const bool big = p.n_row * p.n_head * p.d_head >= (1 << 15);
  parallel_for(big ? pool : nullptr, p.n_row, [&](int64_t b, int64_t e) { rows(p, b, e); });
}

}  // namespace k3
