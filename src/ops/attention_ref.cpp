// attention_ref.cpp: causal / sparse softmax attention in fp64, one (query, head) at a time. See attention.h.
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "ops/attention.h"

namespace k3 {

void attention_ref(const AttentionParams& p) {
  std::vector<int64_t> src;
  std::vector<double> s, acc(p.d_v);
  for (int64_t i = 0; i < p.n_q; ++i) {
    src.clear();
    if (p.sel) {
      for (int64_t j = 0; j < p.n_sel; ++j)
        if (p.sel[i * p.n_sel + j] >= 0) src.push_back(p.sel[i * p.n_sel + j]);
    } else {
      for (int64_t t = 0; t <= std::min(p.q_pos0 + i, p.n_kv - 1); ++t) src.push_back(t);
    }
    for (int h = 0; h < p.n_head; ++h) {
      const float* q = p.q + i * p.q_tok_stride + h * p.q_head_stride;
      float* out = p.out + (i * p.n_head + h) * p.d_v;
      s.assign(src.size(), 0.0);
      double m = -std::numeric_limits<double>::infinity();
      for (size_t j = 0; j < src.size(); ++j) {
        const float* k = p.k + src[j] * p.k_tok_stride + h * p.k_head_stride;
        double d = 0;
        for (int c = 0; c < p.d_qk; ++c) d += double(q[c]) * k[c];
        s[j] = d * p.scale;
        m = std::max(m, s[j]);
      }
      double z = 0;
      std::fill(acc.begin(), acc.end(), 0.0);
      for (size_t j = 0; j < src.size(); ++j) {
        const double e = std::exp(s[j] - m);
        z += e;
        const float* v = p.v + src[j] * p.v_tok_stride + h * p.v_head_stride;
        for (int c = 0; c < p.d_v; ++c) acc[c] += e * v[c];
      }
      for (int c = 0; c < p.d_v; ++c) out[c] = z > 0 ? float(acc[c] / z) : 0.f;
    }
  }
}

}  // namespace k3
