// sigmoid_cpu.cpp: fast CPU sigmoid (sigmoid.h), branchless exp (vec_math.h), portable + AVX-512 bodies.
#include "core/cpu_features.h"
#include "core/thread_pool.h"
#include "ops/sigmoid.h"
#include "ops/vec_math.h"

namespace k3 {

namespace {

K3_OPS_INLINE void rows_body(const SigmoidParams& p, int64_t r0, int64_t r1) {
  const int64_t ldx = p.ldx ? p.ldx : p.d, ldy = p.ldy ? p.ldy : p.d;
  for (int64_t t = r0; t < r1; ++t) {
    const float* x = p.x + t * ldx;
    float* y = p.y + t * ldy;
    for (int64_t i = 0; i < p.d; ++i) y[i] = vecmath::sigmoid_fast(x[i]);
  }
}

void rows_portable(const SigmoidParams& p, int64_t r0, int64_t r1) { rows_body(p, r0, r1); }
K3_OPS_AVX512 void rows_avx512(const SigmoidParams& p, int64_t r0, int64_t r1) { rows_body(p, r0, r1); }

}  // namespace

void sigmoid_cpu(const SigmoidParams& p, ThreadPool* pool) {
  auto* rows = cpu_level() >= CpuLevel::avx512 && K3_OPS_HAVE_AVX512 ? rows_avx512 : rows_portable;
  const bool big = p.n_row * p.d >= (1 << 15);
  parallel_for(big ? pool : nullptr, p.n_row, [&](int64_t b, int64_t e) { rows(p, b, e); });
}

}  // namespace k3
