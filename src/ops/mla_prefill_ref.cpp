// mla_prefill_ref.cpp: fp64 reference of dense causal MLA prefill attention (mla_prefill.h).
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "ops/mla_prefill.h"

namespace k3 {

Status mla_prefill_check(const MlaPrefillParams& p) {
  if (p.n_q < 1 || p.n_head < 1 || p.q_pos0 < 0)
    return error(Code::invalid_argument, "mla_prefill: n_q and n_head must be >= 1, q_pos0 >= 0");
  if (int64_t(p.n_kv) < int64_t(p.q_pos0) + p.n_q)
    return error(Code::invalid_argument,
                 "mla_prefill: n_kv " + std::to_string(p.n_kv) +
                     " < q_pos0 + n_q = " + std::to_string(int64_t(p.q_pos0) + p.n_q));
  if (!p.q || !p.k_nope || !p.k_rope || !p.v || !p.out)
    return error(Code::invalid_argument, "mla_prefill: null pointer");
  for (int64_t s : {p.q_tok_stride, p.q_head_stride, p.k_tok_stride, p.k_head_stride, p.r_tok_stride,
                    p.r_head_stride, p.v_tok_stride, p.v_head_stride})
    if (s < 0 || s % 8 != 0)
      return error(Code::invalid_argument,
                   "mla_prefill: strides must be non-negative multiples of 8, got " + std::to_string(s));
  for (const void* ptr : {(const void*)p.q, (const void*)p.k_nope, (const void*)p.k_rope, (const void*)p.v})
    if (reinterpret_cast<uintptr_t>(ptr) % 16 != 0)
      return error(Code::invalid_argument, "mla_prefill: input pointers must be 16-byte aligned");
  return ok_status();
}

void mla_prefill_ref(const MlaPrefillParams& p) {
  K3_ASSERT(mla_prefill_check(p).ok());
  std::vector<double> s, q(kMlaPrefillQk);
  for (int t = 0; t < p.n_q; ++t)
    for (int h = 0; h < p.n_head; ++h) {
      const int n = p.q_pos0 + t + 1;  // keys 0 .. q_pos0 + t
      const uint16_t* qp = p.q + t * p.q_tok_stride + h * p.q_head_stride;
      for (int i = 0; i < kMlaPrefillQk; ++i) q[size_t(i)] = bf16_to_f32(qp[i]);
      s.resize(size_t(n));
      double m = -std::numeric_limits<double>::infinity();
      for (int j = 0; j < n; ++j) {
        const uint16_t* kn = p.k_nope + j * p.k_tok_stride + h * p.k_head_stride;
        const uint16_t* kr = p.k_rope + j * p.r_tok_stride + h * p.r_head_stride;
        double d = 0;
        for (int i = 0; i < kMlaPrefillNope; ++i) d += q[size_t(i)] * bf16_to_f32(kn[i]);
        for (int i = 0; i < kMlaPrefillRope; ++i) d += q[size_t(kMlaPrefillNope + i)] * bf16_to_f32(kr[i]);
        s[size_t(j)] = double(p.scale) * d;
        m = std::max(m, s[size_t(j)]);
      }
      double l = 0;
      for (int j = 0; j < n; ++j) l += (s[size_t(j)] = std::exp(s[size_t(j)] - m));
      float* o = p.out + (int64_t(t) * p.n_head + h) * kMlaPrefillV;
      for (int i = 0; i < kMlaPrefillV; ++i) {
        double acc = 0;
        for (int j = 0; j < n; ++j)
          acc += s[size_t(j)] * bf16_to_f32(p.v[j * p.v_tok_stride + h * p.v_head_stride + i]);
        o[i] = float(acc / l);
      }
    }
}

}  // namespace k3
