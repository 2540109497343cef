// softmax_cpu.cpp: fast CPU softmax (softmax.h): max pass, exp pass writing y and summing (16 partial
// sums), scale pass. Branchless exp (vec_math.h); one body for portable and AVX-512.
#include "core/cpu_features.h"
#include "core/thread_pool.h"
#include "ops/softmax.h"
#include "ops/vec_math.h"

namespace k3 {

namespace {

using namespace vecmath;

K3_OPS_INLINE void rows_body(const SoftmaxParams& p, int64_t r0, int64_t r1) {
  const int64_t ldx = p.ldx ? p.ldx : p.n, ldy = p.ldy ? p.ldy : p.n, n = p.n;
  const float s = p.scale;
  for (int64_t t = r0; t < r1; ++t) {
    const float* x = p.x + t * ldx;
    float* y = p.y + t * ldy;
    float mx[16];
    for (int l = 0; l < 16; ++l) mx[l] = -__builtin_inff();
    int64_t i = 0;
    for (; i + 16 <= n; i += 16)
      for (int l = 0; l < 16; ++l) mx[l] = mx[l] > s * x[i + l] ? mx[l] : s * x[i + l];
    for (; i < n; ++i) mx[i % 16] = mx[i % 16] > s * x[i] ? mx[i % 16] : s * x[i];
    float m = mx[0];
    for (int l = 1; l < 16; ++l) m = m > mx[l] ? m : mx[l];
    float acc[16] = {};
    for (i = 0; i + 16 <= n; i += 16)
      for (int l = 0; l < 16; ++l) {
        const float e = exp_fast(s * x[i + l] - m);
        y[i + l] = e;
        acc[l] += e;
      }
    for (; i < n; ++i) {
      const float e = exp_fast(s * x[i] - m);
      y[i] = e;
      acc[i % 16] += e;
    }
    float sum = 0;
    for (int l = 0; l < 16; ++l) sum += acc[l];
    const float inv = 1.0f / sum;
    for (int64_t k = 0; k < n; ++k) y[k] *= inv;
  }
}

void rows_portable(const SoftmaxParams& p, int64_t r0, int64_t r1) { rows_body(p, r0, r1); }
K3_OPS_AVX512 void rows_avx512(const SoftmaxParams& p, int64_t r0, int64_t r1) { rows_body(p, r0, r1); }

}  // namespace

void softmax_cpu(const SoftmaxParams& p, ThreadPool* pool) {
  auto* rows = cpu_level() >= CpuLevel::avx512 && K3_OPS_HAVE_AVX512 ? rows_avx512 : rows_portable;
  const bool big = p.n_row * p.n >= (1 << 15);
  parallel_for(big ? pool : nullptr, p.n_row, [&](int64_t b, int64_t e) { rows(p, b, e); });
}

}  // namespace k3
