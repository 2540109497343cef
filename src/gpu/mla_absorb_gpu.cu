// mla_absorb_gpu.cu: the two per-head products of absorbed MLA (model/mla.cpp, MODEL.md §5), blocks_gpu.cuh:
//
//   q^[t, h, :] = [W_UK_h^T q_nope[t, h, :] | q_r[t, h, :]]      W_UK[h, a, j] = kv_b_proj[h * wkv + a, j]
//   z[t, h, d]  = sum_j W_UV[h, d, j] z^[t, h, j]                W_UV[h, d, j] = kv_b_proj[h * wkv + dn + d,
//   j]
//
// fp32 sums, in the CPU's order per output where the kernels split the sum (quarters / warps added in order);
// W_UK / W_UV read from the bf16 kv_b_proj itself, or from the fp32 copy other dtypes get (weights_gpu.cu).
#include <type_traits>

#include "core/env.h"
#include "gpu/blocks_gpu.cuh"
#include "ops/cuda_util.cuh"

namespace k3::gpu {

namespace {

// W_UK / W_UV element i of kv_b_proj: from the bf16 weight itself, or from the fp32 copy other dtypes get.
__device__ __forceinline__ float kvb_at(const float* w, int64_t i) {
  return w[i];
}
__device__ __forceinline__ float kvb_at(const uint16_t* w, int64_t i) {
  return __uint_as_float(uint32_t(w[i]) << 16);
}

// qh[t, h, :] = [sum_a q_nope[t, h, a] W_UK[h, a, :] | q_r[t, h, :]] (bf16-rounded when round), W_UK[h, a, j]
// = kvb[h*wkv + a, j]. Block (h, 64 columns j), grid (nh, ceil(dl / 64)): thread (quarter qq = tid / 64,
// column c) sums a over its quarter of [0, dn) (a warp's loads are one coalesced row segment, 8 in flight);
// the four quarters add in order through shared memory. (A thread per output summing all dn: 22 us, 0.27 of
// copy at batch 1, session 9's ncu.)
template <class TW>
__global__ void __launch_bounds__(256)
    absorb_q_kernel(float* qh, const float* q, const TW* kvb, int64_t n_tok, int nh, int dn, int dr, int R,
                    int wkv, bool round) {
  __shared__ float part[4][64];
  const int h = blockIdx.x, c = threadIdx.x % 64, qq = threadIdx.x / 64;
  const int j = blockIdx.y * 64 + c, dqk = dn + dr, dl = R + dr;
  const int a0 = qq * dn / 4, a1 = (qq + 1) * dn / 4;
  const TW* Wuk = kvb + int64_t(h) * wkv * R + j;
  for (int64_t t = 0; t < n_tok; ++t) {
    const float* qn = q + (t * nh + h) * dqk;
    float acc = 0.f;
    if (j < R) {
#pragma unroll 8
      for (int a = a0; a < a1; ++a) acc += qn[a] * kvb_at(Wuk, int64_t(a) * R);
    }
    part[qq][c] = acc;
    __syncthreads();
    if (qq == 0 && j < dl) {
      const float v = j < R ? ((part[0][c] + part[1][c]) + part[2][c]) + part[3][c] : qn[dn + (j - R)];
      qh[(t * nh + h) * dl + j] = round ? cuda_ops::round_bf16_dev(v) : v;
    }
    __syncthreads();
  }
}

// z[t, h, d] = sum_j W_UV[h, d, j] zh[t, h, j]; W_UV[h, d, j] = kvb[h*wkv + d_nope + d, j]. One warp per
// (h, d) row, lanes over j (coalesced); the row's first kExpandRegs * 32 values stay in registers across the
// tokens. (A thread per output read its 2 KB row alone: 0.08 of copy at batch 1, session 7's ncu.)
constexpr int kExpandRegs = 16;  // 512 = kv_lora_rank of K3 / Kimi Linear
template <class TW>
__global__ void expand_z_kernel(float* z, const float* zh, const TW* kvb, int64_t n_tok, int nh, int dn,
                                int dv, int R, int wkv) {
  k3::cuda_ops::pdl_launch_dependents();  // the next kernel (a GEMV) may start fetching weights
  const int64_t row = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) >> 5;  // h * dv + d
  const int lane = threadIdx.x & 31;
  if (row >= int64_t(nh) * dv) return;
  const int h = int(row / dv), d = int(row % dv);
  const TW* Wuv = kvb + (int64_t(h) * wkv + dn + d) * R;
  float w[kExpandRegs];
#pragma unroll
  for (int i = 0; i < kExpandRegs; ++i) w[i] = lane + 32 * i < R ? kvb_at(Wuv, lane + 32 * i) : 0.f;
  for (int64_t t = 0; t < n_tok; ++t) {
    const float* zt = zh + (t * nh + h) * R;
    float acc = 0.f;
#pragma unroll
    for (int i = 0; i < kExpandRegs; ++i)
      if (lane + 32 * i < R) acc += w[i] * zt[lane + 32 * i];
    for (int j = 32 * kExpandRegs + lane; j < R; j += 32) acc += kvb_at(Wuv, j) * zt[j];
    acc = cuda_ops::warp_sum(acc);
    if (lane == 0) z[(t * nh + h) * dv + d] = acc;
  }
}

// ---- the same two products on 16-byte loads of the bf16 kv_b_proj (session 10; K3 / KL shapes) ----
// Both kernels above issue 2-byte loads (a warp moves 64 bytes an instruction) and reach ~0.28 of copy at
// batch 1 (session 9's ncu: 10.3 / 10.5 us for 12.6 MB each). Here every lane loads 8 columns at once.

__device__ __forceinline__ void bf16x8(const uint4& u, float (&f)[8]) {
  const uint32_t w[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
  for (int i = 0; i < 4; ++i)
    f[2 * i] = __uint_as_float(w[i] << 16), f[2 * i + 1] = __uint_as_float(w[i] & 0xffff0000u);
}

// absorb_q_kernel's product: block (h, 256 columns j), 8 warps splitting dn into runs of dn / 8 rows a, lane
// l owning columns j0 + 8 l ..; the rows' weights are loaded once, up front, and kept in registers across the
// tokens; the warps' partial sums add in warp order through shared memory. The rope part is copied by the
// blocks of the first column group. Serves R % 256 == 0, dn % 8 == 0, dn <= 8 kVecRows (vec_fits).
constexpr int kVecWarps = 8, kVecRows = 16;
__global__ void __launch_bounds__(kVecWarps * 32)
    absorb_q_vec_kernel(float* qh, const float* q, const uint16_t* kvb, int64_t n_tok, int nh, int dn, int dr,
                        int R, int wkv, bool round) {
  __shared__ __align__(16) float part[kVecWarps][256];
  const int h = blockIdx.x, warp = threadIdx.x / 32, lane = threadIdx.x % 32, per = dn / kVecWarps;
  const int j0 = int(blockIdx.y) * 256, dqk = dn + dr, dl = R + dr;
  const uint16_t* W = kvb + (int64_t(h) * wkv + warp * per) * R + j0 + 8 * lane;  // W_UK[h, a, j]
  uint4 w[kVecRows];
#pragma unroll
  for (int i = 0; i < kVecRows; ++i)
    if (i < per) w[i] = __ldg(reinterpret_cast<const uint4*>(W + int64_t(i) * R));
  for (int64_t t = 0; t < n_tok; ++t) {
    const float* qn = q + (t * nh + h) * dqk;
    float acc[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
#pragma unroll
    for (int i = 0; i < kVecRows; ++i) {
      if (i >= per) break;
      const float qa = qn[warp * per + i];
      float f[8];
      bf16x8(w[i], f);
#pragma unroll
      for (int k = 0; k < 8; ++k) acc[k] += qa * f[k];
    }
    float4* pw = reinterpret_cast<float4*>(&part[warp][8 * lane]);
    pw[0] = make_float4(acc[0], acc[1], acc[2], acc[3]), pw[1] = make_float4(acc[4], acc[5], acc[6], acc[7]);
    __syncthreads();
    float* out = qh + (t * nh + h) * dl;
    const int c = threadIdx.x;
    float v = part[0][c];
#pragma unroll
    for (int k = 1; k < kVecWarps; ++k) v += part[k][c];
    out[j0 + c] = round ? cuda_ops::round_bf16_dev(v) : v;
    if (blockIdx.y == 0)
      for (int e = threadIdx.x; e < dr; e += blockDim.x) {
        const float r = qn[dn + e];
        out[R + e] = round ? cuda_ops::round_bf16_dev(r) : r;
      }
    __syncthreads();  // part is rewritten by the next token
  }
}

// expand_z_kernel's product: one warp per (h, d) row, lane l holding columns 8 l + 256 i (i < R / 256) of
// W_UV[h, d, :] in registers across the tokens. Serves R % 256 == 0, R <= 512.
constexpr int kVecExpand = 2;
__global__ void expand_z_vec_kernel(float* z, const float* zh, const uint16_t* kvb, int64_t n_tok, int nh,
                                    int dn, int dv, int R, int wkv) {
  k3::cuda_ops::pdl_launch_dependents();  // the next kernel (a GEMV) may start fetching weights
  const int64_t row = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) >> 5;  // h * dv + d
  const int lane = threadIdx.x & 31, nv = R / 256;
  if (row >= int64_t(nh) * dv) return;
  const int h = int(row / dv), d = int(row % dv);
  const uint16_t* Wuv = kvb + (int64_t(h) * wkv + dn + d) * R + 8 * lane;
  uint4 w[kVecExpand];
#pragma unroll
  for (int i = 0; i < kVecExpand; ++i)
    if (i < nv) w[i] = __ldg(reinterpret_cast<const uint4*>(Wuv + 256 * i));
  for (int64_t t = 0; t < n_tok; ++t) {
    const float* zt = zh + (t * nh + h) * R + 8 * lane;
    float acc = 0.f;
#pragma unroll
    for (int i = 0; i < kVecExpand; ++i) {
      if (i >= nv) break;
      float f[8];
      bf16x8(w[i], f);
      const float4 z0 = *reinterpret_cast<const float4*>(zt + 256 * i);
      const float4 z1 = *reinterpret_cast<const float4*>(zt + 256 * i + 4);
      acc += f[0] * z0.x + f[1] * z0.y + f[2] * z0.z + f[3] * z0.w + f[4] * z1.x + f[5] * z1.y + f[6] * z1.z +
             f[7] * z1.w;
    }
    acc = cuda_ops::warp_sum(acc);
    if (lane == 0) z[(t * nh + h) * dv + d] = acc;
  }
}

// The vector kernels' shapes (K3, K3.1, Kimi Linear: R = 512, dn = 128); K3_MLA_VEC=0 keeps the scalar ones.
bool vec_fits(int R, int dn) {
  static const bool on = env_switch("K3_MLA_VEC", true);
  return on && R % 256 == 0 && R <= 256 * kVecExpand && dn % kVecWarps == 0 && dn <= kVecWarps * kVecRows;
}

}  // namespace

// q^ rows [n_tok, nh, dl] from q rows [n_tok, nh, dqk] (absorb_q_*_kernel).
template <class TW>
void absorb_q(const GpuCtx& c, float* qh, const float* q, const TW* kvb, int64_t n_tok, int nh, int dn,
              int dr, int R, int wkv) {
  if constexpr (std::is_same_v<TW, uint16_t>) {
    if (vec_fits(R, dn)) {
      absorb_q_vec_kernel<<<dim3(unsigned(nh), unsigned(R / 256)), kVecWarps * 32, 0, c.stream()>>>(
          qh, q, kvb, n_tok, nh, dn, dr, R, wkv, c.bf16());
      return;
    }
  }
  absorb_q_kernel<<<dim3(unsigned(nh), unsigned((R + dr + 63) / 64)), 256, 0, c.stream()>>>(
      qh, q, kvb, n_tok, nh, dn, dr, R, wkv, c.bf16());
}

// z rows [n_tok, nh, dv] from z^ rows [n_tok, nh, R] (expand_z_*_kernel).
template <class TW>
void expand_z(const GpuCtx& c, float* z, const float* zh, const TW* kvb, int64_t n_tok, int nh, int dn,
              int dv, int R, int wkv) {
  if constexpr (std::is_same_v<TW, uint16_t>) {
    if (vec_fits(R, dn)) {
      expand_z_vec_kernel<<<blocks_for(int64_t(nh) * dv * 32), kThreads, 0, c.stream()>>>(z, zh, kvb, n_tok,
                                                                                          nh, dn, dv, R, wkv);
      return;
    }
  }
  expand_z_kernel<<<blocks_for(int64_t(nh) * dv * 32), kThreads, 0, c.stream()>>>(z, zh, kvb, n_tok, nh, dn,
                                                                                  dv, R, wkv);
}

template void absorb_q<float>(const GpuCtx&, float*, const float*, const float*, int64_t, int, int, int, int,
                              int);
template void absorb_q<uint16_t>(const GpuCtx&, float*, const float*, const uint16_t*, int64_t, int, int, int,
                                 int, int);
template void expand_z<float>(const GpuCtx&, float*, const float*, const float*, int64_t, int, int, int, int,
                              int);
template void expand_z<uint16_t>(const GpuCtx&, float*, const float*, const uint16_t*, int64_t, int, int, int,
                                 int, int);

}  // namespace k3::gpu
