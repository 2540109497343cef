// mla_sparse_ref.cpp: fp64 reference of sparse absorbed MLA decode (mla_sparse.h).
#include <string>
#include <vector>

#include "ops/mla_decode.h"
#include "ops/mla_sparse.h"

namespace k3 {

Status mla_sparse_check(const MlaSparseParams& p) {
  if (p.n_q < 0 || p.n_head < 1 || p.topk < 1)
    return error(Code::invalid_argument, "mla_sparse: n_q >= 0, n_head >= 1 and topk >= 1 needed");
  if (p.page_size < 1 || p.max_pages < 1 || p.n_pages < 1)
    return error(Code::invalid_argument, "mla_sparse: page_size, max_pages and n_pages must be >= 1");
  if (p.n_q > 0 && (!p.sel || !p.block_table || !p.cache || !p.q || !p.out))
    return error(Code::invalid_argument, "mla_sparse: null pointer");
  return ok_status();
}

size_t mla_sparse_scratch_bytes(int n_q, int topk) {
  // gathered rows, then ctx_len [n_q] and block_table [n_q] (int32), 256-byte aligned
  const size_t rows = (size_t(n_q) * topk * kMlaRow * 2 + 255) / 256 * 256;
  return rows + 2 * ((size_t(n_q) * 4 + 255) / 256 * 256);
}

void mla_sparse_ref(const MlaSparseParams& p) {
  K3_ASSERT(mla_sparse_check(p).ok());
  std::vector<uint16_t> rows(size_t(p.topk) * kMlaRow);
  std::vector<int32_t> table(1, 0);
  for (int i = 0; i < p.n_q; ++i) {
    const int32_t* sel = p.sel + size_t(i) * p.topk;
    const int32_t* bt = p.block_table + (p.shared_table ? 0 : size_t(i) * p.max_pages);
    int n = 0;
    for (int j = 0; j < p.topk && sel[j] >= 0; ++j, ++n) {
      const int32_t s = sel[j];
      K3_ASSERT(s / p.page_size < p.max_pages);
      const int32_t page = bt[s / p.page_size];
      K3_ASSERT(page >= 0 && page < p.n_pages);
      const uint16_t* r = p.cache + (size_t(page) * p.page_size + size_t(s % p.page_size)) * kMlaRow;
      std::copy(r, r + kMlaRow, rows.data() + size_t(j) * kMlaRow);
    }
    K3_ASSERT(n >= 1);
    MlaDecodeParams d;
    d.n_seq = 1, d.n_head = p.n_head, d.page_size = p.topk, d.max_pages = 1, d.n_pages = 1, d.max_ctx = n;
    d.ctx_len = &n, d.block_table = table.data(), d.cache = rows.data();
    d.q = p.q + size_t(i) * p.n_head * kMlaRow, d.scale = p.scale;
    d.out = p.out + size_t(i) * p.n_head * kMlaLatent;
    mla_decode_ref(d);
  }
}

}  // namespace k3
