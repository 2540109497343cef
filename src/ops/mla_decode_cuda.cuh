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
constexpr int kMmaHeads = 32, kWgHeads = 64;

__device__ __forceinline__ const uint16_t* row_ptr(const MlaDecodeParams& p, int b, int t) {
  const int page = p.block_table[size_t(b) * p.max_pages + t / p.page_size];
  return p.cache + (size_t(page) * p.page_size + t % p.page_size) * kMlaRow;
}

__device__ __forceinline__ uint32_t smem_addr(const void* ptr) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(ptr));
}

__device__ __forceinline__ void cp_async16(uint32_t dst, const void* src) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(dst), "l"(src));
}
__device__ __forceinline__ void cp_async_commit() {
  asm volatile("cp.async.commit_group;\n");
}
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

__device__ __forceinline__ void ldsm_x4(uint32_t addr, uint32_t (&r)[4]) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}
__device__ __forceinline__ void ldsm_x4_trans(uint32_t addr, uint32_t (&r)[4]) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}
// c (16x8 fp32) += a (16x16 bf16, row) b (16x8 bf16, col)
__device__ __forceinline__ void mma_bf16(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

}  // namespace k3::mla_detail
