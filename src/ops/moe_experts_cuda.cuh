// moe_experts_cuda.cuh: internal to the routed-expert kernels (moe_experts_cuda.cu,
// moe_experts_wgmma_cuda.cu): their arguments and the device helpers both use (cp.async, the MMA, the decode
// of nibble pairs by the rules of moe_experts_layout.h, the activation). Not a public header.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <atomic>
#include <cstdint>

#include "core/cuda_check.h"
#include "ops/cuda_util.cuh"
#include "ops/moe_experts.h"
#include "ops/moe_experts_layout.h"

namespace k3::moe_cuda {

struct GemmArgs {
  const MoeExpertPtrs* experts;
  const int4* tiles;       // decode: sort_kernel's tile table
  const int* offsets;      // [E + 1]
  const int* tile_start;   // [E + 1]
  const int* order;        // [n_rows]
  int E, k, n_out, K;      // neurons (rows of W), reduction length
  const __nv_bfloat16* x;  // DUAL: zb [n_tok, K] gathered by order / k; else h [n_rows, K] sorted
  __nv_bfloat16* out;      // DUAL: h [n_rows, n_out] sorted; else o [n_rows, n_out] at order[r]
  MoeAct act;
  float beta1, beta2;
};

__device__ __forceinline__ void mma_bf16(float* c, const uint32_t* a, uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

__device__ __forceinline__ void cp_async16(void* smem, const void* gmem, bool valid) {
  const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(s), "l"(gmem), "r"(valid ? 16 : 0));
}
__device__ __forceinline__ void cp_async_commit() {
  asm volatile("cp.async.commit_group;\n" ::);
}
__device__ __forceinline__ void cp_async_wait_all() {
  asm volatile("cp.async.wait_group 0;\n" ::);
}

__device__ __forceinline__ uint32_t bf16x2_mul(uint32_t a, uint32_t b) {
  __nv_bfloat162 r = __hmul2(*reinterpret_cast<__nv_bfloat162*>(&a), *reinterpret_cast<__nv_bfloat162*>(&b));
  return *reinterpret_cast<uint32_t*>(&r);
}

__device__ __forceinline__ float act_dev(MoeAct act, float g, float u, float b1, float b2) {
  if (act == MoeAct::silu) return g / (1.0f + expf(-g)) * u;
  const float a = b1 * tanhf(g / b1) * (1.0f / (1.0f + expf(-g)));
  return a * (b2 > 0 ? b2 * tanhf(u / b2) : u);
}

// A registers of step pair `wi` (steps 2 wi, 2 wi + 1) for rows g / g + 8: 4 bf16x2 per step
template <bool BIG>
__device__ __forceinline__ void dec_frags(uint32_t w_g, uint32_t w_g8, uint32_t s_g, uint32_t s_g8,
                                          uint32_t t_g, uint32_t t_g8, uint32_t (&f)[2][4]) {
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    f[h][0] = bf16x2_mul(moe::e2m1_pair(w_g, 2 * h), s_g);
    f[h][1] = bf16x2_mul(moe::e2m1_pair(w_g8, 2 * h), s_g8);
    f[h][2] = bf16x2_mul(moe::e2m1_pair(w_g, 2 * h + 1), s_g);
    f[h][3] = bf16x2_mul(moe::e2m1_pair(w_g8, 2 * h + 1), s_g8);
    if constexpr (BIG) {  // e > kPairScaleMax: s_* = 2^126, t_* = 2^(e - 127)
      f[h][0] = bf16x2_mul(f[h][0], t_g), f[h][1] = bf16x2_mul(f[h][1], t_g8);
      f[h][2] = bf16x2_mul(f[h][2], t_g), f[h][3] = bf16x2_mul(f[h][3], t_g8);
    }
  }
}

// the factors of exponent e: s for the first multiply, t for the second (BIG chunks only; 1 where e is small)
__device__ __forceinline__ void pair_scales(uint32_t e, uint32_t& s, uint32_t& t) {
  const bool big = e > moe::kPairScaleMax;
  s = big ? moe::kPairUnit : moe::e8m0_pair_scale(e);
  t = big ? moe::e8m0_bf16x2(e) : 0x3F803F80u;
}

// Token q's outputs of a decode block that split its reduction by scale group: DUAL (16 gate + up neurons)
// v = gate, up of neuron n0 + g, then of n0 + 8 + g -> h at sorted row r0 + q, natural order; else (32 down
// rows) v = rows n0 + g + 8 o, o = 0..3 -> o at row order[r0 + q].
template <bool DUAL>
__device__ __forceinline__ void dec_store_token(const GemmArgs& a, int r0, int q, int n0, int g,
                                                const float (&v)[4]) {
  if constexpr (DUAL) {
#pragma unroll
    for (int o = 0; o < 2; ++o) {
      const int neuron = n0 + 8 * o + g;
      if (neuron >= a.n_out) continue;
      const float gv = cuda_ops::round_bf16_dev(v[2 * o]), uv = cuda_ops::round_bf16_dev(v[2 * o + 1]);
      a.out[size_t(r0 + q) * a.n_out + neuron] =
          __float2bfloat16_rn(act_dev(a.act, gv, uv, a.beta1, a.beta2));
    }
  } else {
    const size_t orow = size_t(a.order[r0 + q]) * a.n_out;
#pragma unroll
    for (int o = 0; o < 4; ++o)
      if (n0 + 8 * o + g < a.n_out) a.out[orow + n0 + 8 * o + g] = __float2bfloat16_rn(v[o]);
  }
}

using cuda_ops::smem_opt_in;

// The wgmma prefill GEMM (moe_experts_wgmma_cuda.cu) over the tiles of sort_kernel run with BT = kWgTile:
// DUAL gate/up -> h (wg order), else down -> o. Needs moe::wg_ok(d_in, d_ff).
void launch_wgmma(const GemmArgs& a, bool dual, int64_t n_rows, cudaStream_t stream);

// The half-precision decode path (moe_experts_f16_cuda.cu). f16_image: the rows' activation images
// (moe::f16_pos order, factors 2^6 / s) from z (fp32, bf16-rounded first) or from h (bf16); img
// [n_rows, K / 32, 32] f16, fx [n_rows, K / 32]. launch_decode_f16: the gate / up (dual: a.x unused, the
// image rows are tokens) or down (image rows = sorted rows) kernel over sort_kernel's tiles of T (2 or 4)
// rows; depth: chunks of weights in flight per warp (1, 2, or 3 at T = 2). minb4: the T = 2, depth 2 kernels
// sized for 4 blocks an SM (128 registers; bench variant 27). pdl: launched with programmatic serialization
// (run_decode_f16's chain; T = 2, depth 2).
void f16_image(const float* z, int64_t ldz, const __nv_bfloat16* h, int64_t n_rows, int K, __half* img,
               float* fx, cudaStream_t stream, bool pdl = false);
void launch_decode_f16(const GemmArgs& a, const __half* img, const float* fx, bool dual, unsigned max_tiles,
                       int T, int depth, cudaStream_t stream, bool minb4 = false, bool pdl = false);

}  // namespace k3::moe_cuda
