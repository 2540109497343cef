// mla_sparse_cuda.cu: sparse absorbed MLA decode = gather of the selected latent rows + mla_decode_cuda
// (mla_sparse.h).
#include <algorithm>

#include "ops/cuda_util.cuh"
#include "ops/mla_decode.h"
#include "ops/mla_sparse.h"

namespace k3 {
namespace {

// grid (topk / 8 row groups, n_q); 8 warps, one row each: 576 bf16 = 72 x 16 bytes. Block 0 of each query
// also writes its ctx_len (the count of valid selections: sel is -1 padded at the end) and page index.
__global__ void gather_kernel(MlaSparseParams p, uint16_t* rows, int32_t* len, int32_t* table) {
  const int i = blockIdx.y, warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int j = int(blockIdx.x) * 8 + warp;
  const int32_t* sel = p.sel + int64_t(i) * p.topk;
  if (blockIdx.x == 0 && threadIdx.x == 0) table[i] = i;
  if (blockIdx.x == 0 && warp == 0) {
    int n = 0;
    for (int k = lane; k < p.topk; k += 32) n += sel[k] >= 0 ? 1 : 0;
    for (int o = 16; o > 0; o >>= 1) n += __shfl_xor_sync(0xffffffffu, n, o);
    if (lane == 0) len[i] = max(n, 1);
  }
  if (j >= p.topk) return;
  const int32_t s = sel[j];
  if (s < 0) return;
  const int32_t* bt = p.block_table + (p.shared_table ? 0 : int64_t(i) * p.max_pages);
  const int32_t page = bt[s / p.page_size];
  const uint4* src =
      reinterpret_cast<const uint4*>(p.cache + (int64_t(page) * p.page_size + s % p.page_size) * kMlaRow);
  uint4* dst = reinterpret_cast<uint4*>(rows + (int64_t(i) * p.topk + j) * kMlaRow);
  for (int c = lane; c < kMlaRow * 2 / 16; c += 32) dst[c] = src[c];
}

}  // namespace

void mla_sparse_cuda(const MlaSparseParams& p, GpuContext& g) {
  K3_ASSERT(mla_sparse_check(p).ok());
  K3_ASSERT(p.scratch);
  if (p.n_q == 0) return;
  uint8_t* base = static_cast<uint8_t*>(p.scratch);
  const size_t rows_bytes = (size_t(p.n_q) * p.topk * kMlaRow * 2 + 255) / 256 * 256;
  const size_t vec_bytes = (size_t(p.n_q) * 4 + 255) / 256 * 256;
  uint16_t* rows = reinterpret_cast<uint16_t*>(base);
  int32_t* len = reinterpret_cast<int32_t*>(base + rows_bytes);
  int32_t* table = reinterpret_cast<int32_t*>(base + rows_bytes + vec_bytes);
  gather_kernel<<<dim3(unsigned((p.topk + 7) / 8), unsigned(p.n_q)), 256, 0, g.stream>>>(p, rows, len, table);
  K3_CUDA_LAUNCH_CHECK();
  MlaDecodeParams d;
  d.n_seq = p.n_q, d.n_head = p.n_head, d.page_size = p.topk, d.max_pages = 1, d.n_pages = p.n_q;
  d.max_ctx = p.topk, d.ctx_len = len, d.block_table = table, d.cache = rows, d.q = p.q, d.scale = p.scale;
  d.out = p.out;
  d.exact_p = true;  // fp32 softmax weights, as model/mla.cpp (mla_sparse.h)
  mla_decode_cuda(d, g);
}

}  // namespace k3
