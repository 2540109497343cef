// glu_cpu.cpp: fast CPU SiTU-GLU / SiLU-GLU (glu.h). One body compiled for portable and AVX-512;
// exp, sigmoid and tanh are the branchless fp32 forms of vec_math.h so the loops vectorize.
#include "core/cpu_features.h"
#include "core/thread_pool.h"
#include "ops/glu.h"
#include "ops/vec_math.h"

namespace k3 {

namespace {

using namespace vecmath;

K3_OPS_INLINE void rows_body(const GluParams& p, int64_t r0, int64_t r1) {
  const int64_t ldg = p.ldg ? p.ldg : p.d, ldu = p.ldu ? p.ldu : p.d, ldh = p.ldh ? p.ldh : p.d;
  const bool bf16 = p.precision == Precision::bf16;
  const float b1 = p.beta1, inv_b1 = 1.0f / p.beta1, b2 = p.beta2, inv_b2 = p.beta2 > 0 ? 1.0f / p.beta2 : 0.f;
  for (int64_t t = r0; t < r1; ++t) {
    const float* g = p.g + t * ldg;
    const float* u = p.u + t * ldu;
    float* h = p.h + t * ldh;
    if (p.kind == GluKind::silu) {
      for (int64_t i = 0; i < p.d; ++i) {
        const float v = g[i] * sigmoid_fast(g[i]) * u[i];
        h[i] = bf16 ? round_bf16_fast(v) : v;
      }
    } else if (p.beta2 > 0) {
      for (int64_t i = 0; i < p.d; ++i) {
        const float a = b1 * tanh_fast(g[i] * inv_b1) * sigmoid_fast(g[i]);
        const float v = a * (b2 * tanh_fast(u[i] * inv_b2));
        h[i] = bf16 ? round_bf16_fast(v) : v;
      }
    } else {
      for (int64_t i = 0; i < p.d; ++i) {
        const float v = b1 * tanh_fast(g[i] * inv_b1) * sigmoid_fast(g[i]) * u[i];
        h[i] = bf16 ? round_bf16_fast(v) : v;
      }
    }
  }
}

void rows_portable(const GluParams& p, int64_t r0, int64_t r1) { rows_body(p, r0, r1); }
K3_OPS_AVX512 void rows_avx512(const GluParams& p, int64_t r0, int64_t r1) { rows_body(p, r0, r1); }

}  // namespace

void glu_cpu(const GluParams& p, ThreadPool* pool) {
  auto* rows = cpu_level() >= CpuLevel::avx512 && K3_OPS_HAVE_AVX512 ? rows_avx512 : rows_portable;
  const bool big = p.n_tok * p.d >= (1 << 14);
  parallel_for(big ? pool : nullptr, p.n_tok, [&](int64_t b, int64_t e) { rows(p, b, e); });
}

}  // namespace k3
