// kda_fast_decode_io.cuh: how the fast KDA decode kernels (kda_fast.h) read a sequence's inputs, write its
// output and find its state: the bf16 arrays (qkv, f, b, gate, out) or the fp32 rows of x32 / out32, and
// the state in a slot (S, conv + slot), a device table (S_seq, conv_seq) or the parameters (S_inline,
// conv_inline). One rule per field, shared by every kernel version and mirrored by kda_decode_fast_ref.
#pragma once

#include <cuda_bf16.h>

#include <cstdint>

#include "ops/kda_fast.h"

namespace k3::kda_io {

constexpr int DK = 128, DV = 128;

__device__ __forceinline__ float bf16_value(uint16_t x) {
  return __uint_as_float(uint32_t(x) << 16);
}
__device__ __forceinline__ uint16_t bf16_bits(float x) {
  return __bfloat16_as_ushort(__float2bfloat16_rn(x));
}

// Pre-conv projection m (0 q~, 1 k~, 2 v~) of sequence b, channel ch in [0, n_head d_k): bf16 bits.
__device__ __forceinline__ uint16_t qkv(const KdaDecodeParams& p, int b, int m, int ch) {
  const size_t HK = size_t(p.n_head) * DK;
  return p.x32[0] ? bf16_bits(p.x32[m][size_t(b) * HK + ch]) : p.qkv[(size_t(b) * 3 + m) * HK + ch];
}
// f_b_proj output (decay pre-activation), channel ch in [0, n_head d_k)
__device__ __forceinline__ float f(const KdaDecodeParams& p, int b, int ch) {
  const size_t i = size_t(b) * p.n_head * DK + ch;
  return p.x32[0] ? p.x32[3][i] : bf16_value(p.f[i]);
}
// output-gate projection, column c in [0, n_head d_v)
__device__ __forceinline__ float gate(const KdaDecodeParams& p, int b, int c) {
  const size_t i = size_t(b) * p.n_head * DV + c;
  return p.x32[0] ? p.x32[4][i] : bf16_value(p.gate[i]);
}
// b_proj output (beta logit) of head h
__device__ __forceinline__ float beta_logit(const KdaDecodeParams& p, int b, int h) {
  const size_t i = size_t(b) * p.n_head + h;
  return p.x32[0] ? p.x32[5][i] : bf16_value(p.b[i]);
}
// out[b, c] = bf16(y)
__device__ __forceinline__ void store_out(const KdaDecodeParams& p, int b, int c, float y) {
  const size_t i = size_t(b) * p.n_head * DV + c;
  if (p.out32)
    p.out32[i] = __bfloat162float(__float2bfloat16_rn(y));
  else
    p.out[i] = bf16_bits(y);
}

// Sequence b's state [n_head, d_k, d_v] and conv window [3, 3, n_head d_k].
__device__ __forceinline__ float* state(const KdaDecodeParams& p, int b) {
  if (p.S_inline[0]) return p.S_inline[b];
  return p.S_seq ? p.S_seq[b] : p.S + size_t(p.slot[b]) * p.n_head * DK * DV;
}
__device__ __forceinline__ uint16_t* window(const KdaDecodeParams& p, int b) {
  if (p.S_inline[0]) return p.conv_inline[b];
  return p.conv_seq ? p.conv_seq[b] : p.conv + size_t(p.slot[b]) * 9 * p.n_head * DK;
}

}  // namespace k3::kda_io
