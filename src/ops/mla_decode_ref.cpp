// mla_decode_ref.cpp: fp64 reference of absorbed MLA decode over the paged latent cache (mla_decode.h).
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "ops/mla_decode.h"

namespace k3 {

Status mla_decode_check(const MlaDecodeParams& p) {
  if (p.n_seq < 1 || p.n_head < 1) return error(Code::invalid_argument, "mla_decode: n_seq and n_head must be >= 1");
  if (p.page_size < 1 || p.max_pages < 1 || p.n_pages < 1)
    return error(Code::invalid_argument, "mla_decode: page_size, max_pages and n_pages must be >= 1");
  if (p.max_ctx < 1 || int64_t(p.max_ctx) > int64_t(p.max_pages) * p.page_size)
    return error(Code::invalid_argument, "mla_decode: max_ctx " + std::to_string(p.max_ctx) +
                                             " outside [1, max_pages * page_size]");
  if (!p.ctx_len || !p.block_table || !p.cache || !p.q || !p.out)
    return error(Code::invalid_argument, "mla_decode: null pointer");
  if (p.n_split < 0) return error(Code::invalid_argument, "mla_decode: n_split must be >= 0");
  return ok_status();
}

void mla_decode_ref(const MlaDecodeParams& p) {
  K3_ASSERT(mla_decode_check(p).ok());
  std::vector<double> s, row;
  for (int b = 0; b < p.n_seq; ++b) {
    const int n = p.ctx_len[b];
    K3_ASSERT(n >= 1 && n <= p.max_ctx);
    // rows of this sequence, widened once: row[t * 576 + i]
    row.assign(size_t(n) * kMlaRow, 0.0);
    for (int t = 0; t < n; ++t) {
      const int32_t page = p.block_table[size_t(b) * p.max_pages + size_t(t / p.page_size)];
      K3_ASSERT(page >= 0 && page < p.n_pages);
      const uint16_t* r = p.cache + (size_t(page) * p.page_size + size_t(t % p.page_size)) * kMlaRow;
      for (int i = 0; i < kMlaRow; ++i) row[size_t(t) * kMlaRow + i] = bf16_to_f32(r[i]);
    }
    s.resize(size_t(n));
    for (int h = 0; h < p.n_head; ++h) {
      const uint16_t* q = p.q + (size_t(b) * p.n_head + h) * kMlaRow;
      double m = -std::numeric_limits<double>::infinity();
      for (int t = 0; t < n; ++t) {
        double d = 0;
        for (int i = 0; i < kMlaRow; ++i) d += double(bf16_to_f32(q[i])) * row[size_t(t) * kMlaRow + i];
        s[size_t(t)] = double(p.scale) * d;
        m = std::max(m, s[size_t(t)]);
      }
      double l = 0;
      for (int t = 0; t < n; ++t) l += (s[size_t(t)] = std::exp(s[size_t(t)] - m));
      float* o = p.out + (size_t(b) * p.n_head + h) * kMlaLatent;
      for (int i = 0; i < kMlaLatent; ++i) {
        double acc = 0;
        for (int t = 0; t < n; ++t) acc += s[size_t(t)] * row[size_t(t) * kMlaRow + i];
        o[i] = float(acc / l);
      }
    }
  }
}

}  // namespace k3
