// dsa_topk_ref.cpp: plain reference of the DSA causal top-k (dsa_topk.h), the CPU model's selection rule.
#include <algorithm>
#include <numeric>
#include <string>
#include <vector>

#include "ops/dsa_topk.h"

namespace k3 {

Status dsa_topk_check(const DsaTopkParams& p) {
  if (p.n_row < 0 || p.topk < 1)
    return error(Code::invalid_argument,
                 "dsa_topk: n_row must be >= 0 and topk >= 1 (topk=" + std::to_string(p.topk) + ")");
  if (p.max_len < 0 || p.max_len > p.ld || (!p.row_len && p.len0 + p.n_row - 1 > p.max_len))
    return error(Code::invalid_argument, "dsa_topk: max_len " + std::to_string(p.max_len) +
                                             " must bound every row length and be <= ld " +
                                             std::to_string(p.ld));
  if (p.max_len > (int64_t(1) << 30))
    return error(Code::unsupported, "dsa_topk: rows longer than 2^30 (" + std::to_string(p.max_len) + ")");
  if (p.cluster < 0 || p.cluster > 16) return error(Code::invalid_argument, "dsa_topk: cluster must be 0..16");
  if (p.kernel == DsaTopkKernel::sample && p.topk > kDsaTopkSampleMaxK)
    return error(Code::unsupported,
                 "dsa_topk: the sample kernel takes topk <= " + std::to_string(kDsaTopkSampleMaxK) +
                     " (topk=" + std::to_string(p.topk) + ")");
  if (p.n_row > 0 && (!p.score || !p.sel)) return error(Code::invalid_argument, "dsa_topk: null pointer");
  return ok_status();
}

void dsa_topk_ref(const DsaTopkParams& p) {
  K3_ASSERT(dsa_topk_check(p).ok());
  std::vector<int32_t> idx;
  for (int i = 0; i < p.n_row; ++i) {
    const int64_t n = p.row_len ? p.row_len[i] : p.len0 + i;
    K3_ASSERT(n >= 0 && n <= p.max_len);
    int32_t* out = p.sel + int64_t(i) * p.topk;
    std::fill(out, out + p.topk, -1);
    if (n <= p.topk) {
      std::iota(out, out + n, 0);
      continue;
    }
    const float* row = p.score + int64_t(i) * p.ld;
    idx.resize(size_t(n));
    std::iota(idx.begin(), idx.end(), 0);
    std::partial_sort(idx.begin(), idx.begin() + p.topk, idx.end(),
                      [&](int32_t l, int32_t r) { return row[l] > row[r] || (row[l] == row[r] && l < r); });
    std::sort(idx.begin(), idx.begin() + p.topk);
    std::copy(idx.begin(), idx.begin() + p.topk, out);
  }
}

}  // namespace k3
