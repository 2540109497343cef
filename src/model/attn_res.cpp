// attn_res.cpp: Block AttnRes depth mixing (attn_res.h, MODEL.md §7).
#include "model/attn_res.h"

#include <algorithm>
#include <cmath>

namespace k3 {

std::vector<float> bind_attn_res_query(Binder& b, const std::string& base, int64_t d_model) {
  std::vector<float> norm = b.vec(base + "_norm.weight", d_model);
  std::vector<float> proj = b.vec(base + "_proj.weight", d_model);  // [1, D]
  if (norm.size() != size_t(d_model) || proj.size() != size_t(d_model)) return {};
  for (int64_t i = 0; i < d_model; ++i) norm[size_t(i)] *= proj[size_t(i)];
  return norm;
}

void attn_res_mix(const Ctx& c, const std::vector<const float*>& sources, const float* q, float eps,
                  int64_t n_tok, int64_t d_model, float* out) {
  const size_t n = sources.size();
  std::vector<float> s(n);
  for (int64_t t = 0; t < n_tok; ++t) {
    float m = -INFINITY;
    for (size_t i = 0; i < n; ++i) {
      const float* v = sources[i] + t * d_model;
      float dot = 0.f, ss = 0.f;
      for (int64_t d = 0; d < d_model; ++d) {
        dot += q[d] * v[d];
        ss += v[d] * v[d];
      }
      s[i] = dot / std::sqrt(ss / float(d_model) + eps);
      m = std::max(m, s[i]);
    }
    float z = 0.f;
    for (size_t i = 0; i < n; ++i) z += (s[i] = std::exp(s[i] - m));
    float* o = out + t * d_model;
    std::fill(o, o + d_model, 0.f);
    for (size_t i = 0; i < n; ++i) {
      const float a = s[i] / z;
      const float* v = sources[i] + t * d_model;
      for (int64_t d = 0; d < d_model; ++d) o[d] += a * v[d];
    }
  }
  c.rnd(out, n_tok * d_model);
}

}  // namespace k3
