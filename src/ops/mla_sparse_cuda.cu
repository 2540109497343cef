// mla_sparse_cuda.cu: sparse absorbed MLA decode (mla_sparse.h) = mla_decode_cuda over each query's selected
// rows, addressed in place: a table kernel writes row j of query i's virtual sequence as the physical cache
// row of sel[i, j] (page * P + slot), and mla_decode_cuda reads the cache as pages of one row through it.
// With K3_MLA_SPARSE_GATHER=1 (read per call) the rows are first copied into scratch instead (the session-4
// path: each selected row is read twice and written once).
#include <algorithm>

#include "core/env.h"
#include "ops/cuda_util.cuh"
#include "ops/mla_decode.h"
#include "ops/mla_sparse.h"

namespace k3 {
namespace {

// Lane `lane` of the one warp that counts query i's valid selections (sel is -1 padded at the end): writes
// ctx_len = max(count, 1).
__device__ __forceinline__ void write_len(const int32_t* sel, int topk, int lane, int32_t* len_i) {
  int n = 0;
  for (int k = lane; k < topk; k += 32) n += sel[k] >= 0 ? 1 : 0;
  for (int o = 16; o > 0; o >>= 1) n += __shfl_xor_sync(0xffffffffu, n, o);
  if (lane == 0) *len_i = max(n, 1);
}

// The cache row (page * P + slot) of position s of query i.
__device__ __forceinline__ int64_t cache_row(const MlaSparseParams& p, int i, int32_t s) {
  const int32_t* bt = p.block_table + (p.shared_table ? 0 : int64_t(i) * p.max_pages);
  return int64_t(bt[s / p.page_size]) * p.page_size + s % p.page_size;
}

// grid (topk / 8 row groups, n_q); 8 warps, one row each: 576 bf16 = 72 x 16 bytes. Block 0 of each query
// also writes its ctx_len and page index.
__global__ void gather_kernel(MlaSparseParams p, uint16_t* rows, int32_t* len, int32_t* table) {
  const int i = blockIdx.y, warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int j = int(blockIdx.x) * 8 + warp;
  const int32_t* sel = p.sel + int64_t(i) * p.topk;
  if (blockIdx.x == 0 && threadIdx.x == 0) table[i] = i;
  if (blockIdx.x == 0 && warp == 0) write_len(sel, p.topk, lane, len + i);
  if (j >= p.topk) return;
  const int32_t s = sel[j];
  if (s < 0) return;
  const uint4* src = reinterpret_cast<const uint4*>(p.cache + cache_row(p, i, s) * kMlaRow);
  uint4* dst = reinterpret_cast<uint4*>(rows + (int64_t(i) * p.topk + j) * kMlaRow);
  for (int c = lane; c < kMlaRow * 2 / 16; c += 32) dst[c] = src[c];
}

// grid (topk / 256 blocks, n_q); thread j: rows[i, j] = the cache row of sel[i, j] (past |S_i| position 0's
// row, never read, as ctx_len = |S_i|); warp 0 of block 0 also writes ctx_len.
__global__ void row_table_kernel(MlaSparseParams p, int32_t* rows, int32_t* len) {
  const int i = blockIdx.y, j = int(blockIdx.x) * blockDim.x + threadIdx.x;
  const int32_t* sel = p.sel + int64_t(i) * p.topk;
  if (blockIdx.x == 0 && threadIdx.x < 32) write_len(sel, p.topk, int(threadIdx.x), len + i);
  if (j >= p.topk) return;
  rows[int64_t(i) * p.topk + j] = int32_t(cache_row(p, i, max(sel[j], 0)));
}

}  // namespace

void mla_sparse_cuda(const MlaSparseParams& p, GpuContext& g) {
  K3_ASSERT(mla_sparse_check(p).ok());
  K3_ASSERT(p.scratch);
  if (p.n_q == 0) return;
  uint8_t* base = static_cast<uint8_t*>(p.scratch);
  MlaDecodeParams d;
  d.n_seq = p.n_q, d.n_head = p.n_head, d.max_ctx = p.topk, d.q = p.q, d.scale = p.scale, d.out = p.out;
  d.exact_p = true;  // fp32 softmax weights, as model/mla.cpp (mla_sparse.h)
  d.n_split = p.n_split;
  const size_t vec_bytes = (size_t(p.n_q) * 4 + 255) / 256 * 256;
  if (!env_switch("K3_MLA_SPARSE_GATHER", false)) {
    int32_t* len = reinterpret_cast<int32_t*>(base);
    int32_t* rows = reinterpret_cast<int32_t*>(base + vec_bytes);
    row_table_kernel<<<dim3(unsigned((p.topk + 255) / 256), unsigned(p.n_q)), 256, 0, g.stream>>>(p, rows,
                                                                                                  len);
    K3_CUDA_LAUNCH_CHECK();
    d.page_size = 1, d.max_pages = p.topk, d.n_pages = p.n_pages * p.page_size;
    d.ctx_len = len, d.block_table = rows, d.cache = p.cache;
    mla_decode_cuda(d, g);
    return;
  }
  const size_t rows_bytes = (size_t(p.n_q) * p.topk * kMlaRow * 2 + 255) / 256 * 256;
  uint16_t* rows = reinterpret_cast<uint16_t*>(base);
  int32_t* len = reinterpret_cast<int32_t*>(base + rows_bytes);
  int32_t* table = reinterpret_cast<int32_t*>(base + rows_bytes + vec_bytes);
  gather_kernel<<<dim3(unsigned((p.topk + 7) / 8), unsigned(p.n_q)), 256, 0, g.stream>>>(p, rows, len, table);
  K3_CUDA_LAUNCH_CHECK();
  d.page_size = p.topk, d.max_pages = 1, d.n_pages = p.n_q;
  d.ctx_len = len, d.block_table = table, d.cache = rows;
  mla_decode_cuda(d, g);
}

}  // namespace k3
