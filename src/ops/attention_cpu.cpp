// attention_cpu.cpp: causal / sparse softmax attention in fp32 with a two-pass softmax, threads over
// (query, head) pairs. See attention.h.
#include <algorithm>
#include <cmath>
#include <vector>

#include "core/status.h"
#include "core/thread_pool.h"
#include "ops/attention.h"

namespace k3 {

void attention_cpu(const AttentionParams& p, ThreadPool* pool) {
  K3_ASSERT(p.n_head > 0 && p.d_qk > 0 && p.d_v > 0);
  parallel_for(pool, p.n_q * p.n_head, [&](int64_t w0, int64_t w1) {
    std::vector<int64_t> src;
    std::vector<float> s;
    int64_t cur_i = -1;
    for (int64_t w = w0; w < w1; ++w) {
      const int64_t i = w / p.n_head;
      const int h = int(w % p.n_head);
      if (i != cur_i) {  // the source set is shared by all heads of a query
        cur_i = i;
        src.clear();
        if (p.sel) {
          for (int64_t j = 0; j < p.n_sel; ++j)
            if (p.sel[i * p.n_sel + j] >= 0) src.push_back(p.sel[i * p.n_sel + j]);
        } else {
          const int64_t last = std::min(p.q_pos0 + i, p.n_kv - 1);
          for (int64_t t = 0; t <= last; ++t) src.push_back(t);
        }
      }
      const float* q = p.q + i * p.q_tok_stride + h * p.q_head_stride;
      float* out = p.out + (i * p.n_head + h) * p.d_v;
      s.resize(src.size());
      float m = -INFINITY;
      for (size_t j = 0; j < src.size(); ++j) {
        const float* k = p.k + src[j] * p.k_tok_stride + h * p.k_head_stride;
        float d = 0.f;
        for (int c = 0; c < p.d_qk; ++c) d += q[c] * k[c];
        s[j] = d * p.scale;
        m = std::max(m, s[j]);
      }
      for (int c = 0; c < p.d_v; ++c) out[c] = 0.f;
      float z = 0.f;
      for (size_t j = 0; j < src.size(); ++j) {
        const float e = std::exp(s[j] - m);
        z += e;
        const float* v = p.v + src[j] * p.v_tok_stride + h * p.v_head_stride;
        for (int c = 0; c < p.d_v; ++c) out[c] += e * v[c];
      }
      const float inv = z > 0.f ? 1.f / z : 0.f;
      for (int c = 0; c < p.d_v; ++c) out[c] *= inv;
    }
  });
}

}  // namespace k3
