// moe_route_ref.cpp: plain reference of the router selection (moe_route.h): a full sort per token.
#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <string>
#include <vector>

#include "ops/moe_route.h"

namespace k3 {

Status moe_route_check(const MoeRouteParams& p) {
  if (p.n_tok < 0 || p.k < 1 || p.k > p.n_expert || p.n_expert > kMoeRouteMaxExpert ||
      (p.ld != 0 && p.ld < p.n_expert))
    return error(Code::unsupported, "moe_route: unsupported shape n_tok=" + std::to_string(p.n_tok) +
                                        " n_expert=" + std::to_string(p.n_expert) + " k=" + std::to_string(p.k) +
                                        " ld=" + std::to_string(p.ld));
  return ok_status();
}

void moe_route_ref(const MoeRouteParams& p) {
  const int E = p.n_expert, k = p.k;
  const int64_t ld = p.ld ? p.ld : E;
  std::vector<float> s(static_cast<size_t>(E)), c(static_cast<size_t>(E));
  std::vector<int32_t> idx(static_cast<size_t>(E));
  for (int64_t t = 0; t < p.n_tok; ++t) {
    for (int e = 0; e < E; ++e) {
      s[size_t(e)] = 1.f / (1.f + std::exp(-p.logits[t * ld + e]));
      const float ce = s[size_t(e)] + p.bias[e];
      c[size_t(e)] = std::isnan(ce) ? -std::numeric_limits<float>::infinity() : ce;
    }
    std::iota(idx.begin(), idx.end(), 0);
    std::stable_sort(idx.begin(), idx.end(), [&](int32_t a, int32_t b) { return c[size_t(a)] > c[size_t(b)]; });
    float sum = 0.f;
    for (int j = 0; j < k; ++j) sum += s[size_t(idx[size_t(j)])];
    for (int j = 0; j < k; ++j) {
      const float sj = s[size_t(idx[size_t(j)])];
      p.sel[t * k + j] = idx[size_t(j)];
      p.wt[t * k + j] = (p.renormalize ? sj / (sum + 1e-20f) : sj) * p.scaling;
    }
  }
}

}  // namespace k3
