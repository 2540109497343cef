// mla_decode_cuda.cuh: internal to the MLA decode kernels (mla_decode*_cuda.cu): the split-KV plan, the
// partials layout and the device helpers the kernels share. Not a public header.
//
// Split-KV (flash-decoding): sequence b's tokens [0, ctx_len[b]) are cut into n_split ranges of split_len
// tokens (a multiple of the 64-token tile). A CTA (head group, split, seq) keeps per head the fp32 running
// max m, sum l and unnormalized output o (512) of its range; mla_combine merges the splits:
//   M = max_s m_s,  out = sum_s exp(m_s - M) o_s / sum_s exp(m_s - M) l_s.
// Partials (g.workspace): o [n_seq, n_split, n_head, 512] then ml [n_seq, n_split, n_head, 2], fp32.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "ops/cuda_mma.cuh"
#include "ops/mla_decode.h"

namespace k3::mla_detail {

constexpr int kTile = 64;             // tokens per shared-memory tile (and split_len granularity)
constexpr int kChunks = kMlaRow / 8;  // 16-byte chunks per 576-wide bf16 row (72)

struct Split {
  int n_split, split_len;
};

// The split plan for CTAs of heads_per_cta heads, fitted into g.workspace (fewer, longer splits when it
// is small). p.n_split > 0 forces the count.
Split fit_split(const MlaDecodeParams& p, const GpuContext& g, int heads_per_cta);

// Kernels: each writes the partials of grid (ceil(n_head / heads), n_split, n_seq) CTAs.
void launch_split_mma(const MlaDecodeParams& p, const Split& s, float* part_o, float* part_ml,
                      cudaStream_t st);
void launch_split_wgmma(const MlaDecodeParams& p, const Split& s, float* part_o, float* part_ml,
                        cudaStream_t st);
void launch_split_wgmma_hn(const MlaDecodeParams& p, const Split& s, float* part_o, float* part_ml,
                           cudaStream_t st);
constexpr int kMmaHeads = 32, kWgHeads = 64, kWgHnHeads = 48;

__device__ __forceinline__ const uint16_t* row_ptr(const MlaDecodeParams& p, int b, int t) {
  const int page = p.block_table[size_t(b) * p.max_pages + t / p.page_size];
  return p.cache + (size_t(page) * p.page_size + t % p.page_size) * kMlaRow;
}

}  // namespace k3::mla_detail
