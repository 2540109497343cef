// linear_cuda.cu: y = W x on the GPU (linear.h) for every weight dtype, fp32 accumulation everywhere.
//
//   n_tok <= 8 (decode): a GEMV that decodes W in registers, each thread loading
//       8 weights at a time (16 bytes bf16 / f16, 8 fp8, 4 MXFP4; 4 f32 in 16 bytes) and the matching
//       32 bytes of x per token; per load a partial sum (MXFP4: partial * 2^(e-127), exact like the CPU's
//       per-group scaling); rows not aligned to the load width take a scalar loop. x is L1/L2 resident.
//       One resident wave of CTAs, each taking groups of 1 or 4 rows in turn (gemv_launch), the CTA's
//       threads splitting the row; linear_group_cuda stacks several weights of one x into one launch.
//   n_tok > 8 (prefill), cuBLAS GemmEx, column-major view: y^T [out, n_tok] = W [in, out]^T x^T [in, n_tok]:
//       bf16 mode (x bf16-exact) with bf16 / fp8 / MXFP4 weights: x -> bf16 copy, W -> bf16 tile (fp8 and
//           e2m1 * 2^(e-127) are exact in bf16), bf16 x bf16 -> fp32 with CUBLAS_COMPUTE_32F;
//       otherwise (fp32 mode, or f16 / f32 weights): W -> fp32 tile (f32 used in place), fp32 GEMM with
//           CUBLAS_COMPUTE_32F_PEDANTIC (no TF32 unless g.allow_tf32: then _FAST_TF32).
//       Tiles live in g.workspace: the bf16 x copy takes at most half; W is decoded in row tiles that fit
//       the rest, so no full decoded copy is ever made.
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <algorithm>
#include <cstdio>

#include "core/env.h"
#include "ops/cuda_util.cuh"
#include "ops/linear.h"

namespace k3 {

namespace {

using namespace cuda_ops;

enum class WK { f32, bf16, f16, fp8, mxfp4 };

constexpr int kGemvMaxTok = 8, kGemvThreads = 256;

// One lane's weight load in the GEMV: a 4 to 16-byte word holding E weights. E = 8 (4 for f32) for every
// dtype, so a lane reads 32 contiguous bytes of x per token and the warp's x reads stay dense (an MXFP4
// lane reading 16 bytes = 32 weights would touch a 128-byte x line per lane: 4x the L1 traffic).
template <WK K>
struct Chunk {
  using T = uint4;  // f32 (4 weights), bf16 / f16 (8)
  static constexpr int E = K == WK::f32 ? 4 : 8;
};
template <>
struct Chunk<WK::fp8> {
  using T = uint2;  // 8 bytes = 8 weights
  static constexpr int E = 8;
};
template <>
struct Chunk<WK::mxfp4> {
  using T = uint32_t;  // 4 bytes = 8 weights (a quarter of one scale group)
  static constexpr int E = 8;
};

__device__ __forceinline__ float e2m1(uint32_t nib) {  // {0, .5, 1, 1.5, 2, 3, 4, 6} x sign, exact
  const uint32_t em = nib & 7;
  uint32_t bits = em >= 2 ? (((em >> 1) + 126u) << 23) | ((em & 1u) << 22) : (em ? 126u << 23 : 0u);
  return __uint_as_float(bits | ((nib & 8u) << 28));
}
__device__ __forceinline__ float e8m0(uint8_t e) {
  return __uint_as_float(e ? uint32_t(e) << 23 : 0x00400000u);
}
__device__ __forceinline__ float fp8(uint8_t b) {
  return __half2float(__half(__nv_cvt_fp8_to_halfraw(__nv_fp8_storage_t(b), __NV_E4M3)));
}

// W[o, c] as fp32 (MXFP4 with its scale: e2m1 * 2^(e-127) is exact in fp32 for the scales checkpoints use).
template <WK K>
__device__ __forceinline__ float weight_at(const void* w, const uint8_t* scale, int64_t in, int64_t o,
                                           int64_t c) {
  if constexpr (K == WK::f32) return static_cast<const float*>(w)[o * in + c];
  if constexpr (K == WK::bf16)
    return __uint_as_float(uint32_t(static_cast<const uint16_t*>(w)[o * in + c]) << 16);
  if constexpr (K == WK::f16)
    return __half2float(__ushort_as_half(static_cast<const uint16_t*>(w)[o * in + c]));
  if constexpr (K == WK::fp8) return fp8(static_cast<const uint8_t*>(w)[o * in + c]);
  if constexpr (K == WK::mxfp4) {
    const uint8_t byte = static_cast<const uint8_t*>(w)[o * (in / 2) + c / 2];
    return e2m1(c % 2 == 0 ? byte & 0x0f : byte >> 4) * e8m0(scale[o * (in / 32) + c / 32]);
  }
  return 0.f;
}

// The Chunk<K>::E weights of one load, without the MXFP4 scale.
__device__ __forceinline__ void decode_words(const uint4 raw, WK k, float* w) {
  const uint32_t u[4] = {raw.x, raw.y, raw.z, raw.w};
#pragma unroll
  for (int q = 0; q < 4; ++q) {
    if (k == WK::f32) {
      w[q] = __uint_as_float(u[q]);
    } else if (k == WK::bf16) {  // element 2q in the low half
      w[2 * q] = __uint_as_float(u[q] << 16);
      w[2 * q + 1] = __uint_as_float(u[q] & 0xffff0000u);
    } else {  // f16
      w[2 * q] = __half2float(__ushort_as_half(uint16_t(u[q] & 0xffff)));
      w[2 * q + 1] = __half2float(__ushort_as_half(uint16_t(u[q] >> 16)));
    }
  }
}
template <WK K>
__device__ __forceinline__ void decode_chunk(const typename Chunk<K>::T raw, float* w) {
  if constexpr (K == WK::fp8) {
#pragma unroll
    for (int b = 0; b < 4; ++b) w[b] = fp8(uint8_t(raw.x >> (8 * b)));
#pragma unroll
    for (int b = 0; b < 4; ++b) w[4 + b] = fp8(uint8_t(raw.y >> (8 * b)));
  } else if constexpr (K == WK::mxfp4) {  // byte k holds columns 2k (low nibble) and 2k + 1
#pragma unroll
    for (int n = 0; n < 8; ++n) w[n] = e2m1((raw >> (4 * n)) & 0xf);
  } else {
    decode_words(raw, K, w);
  }
}

// One weight of a GEMV launch: its rows are rows row0 .. row0 + out - 1 of the launch.
struct GemvSeg {
  const void* w;
  const uint8_t* scale;
  float* y;  // [n_tok, out], row stride ldy
  int64_t ldy, row0, out;
  bool round;  // y rounded to bf16 (kept in fp32)
};
constexpr int kGemvMaxSeg = 8;

struct GemvArgs {
  GemvSeg seg[kGemvMaxSeg];  // the launch's weights (same dtype and in), rows stacked in order
  int n_seg;
  int64_t out, in, row_bytes;  // out: the rows of all segments
  const float* x;              // [n_tok, in], row stride ldx
  int64_t ldx;
  int n_tok;
  bool x_vec;  // x and ldx allow float4 loads
};

// The segment of launch row o (o < a.out).
__device__ __forceinline__ const GemvSeg& seg_of(const GemvArgs& a, int64_t o) {
  int s = 0;
  while (s + 1 < a.n_seg && o >= a.seg[s + 1].row0) ++s;
  return a.seg[s];
}

// One CTA takes R output rows at a time (row group g = blockIdx.x, + gridDim.x, ...: every CTA gets the same
// number of groups to within one) and its kGemvThreads threads split the group's chunks: thread i loads chunk
// i, i + kGemvThreads, ... of each of the R rows (R independent loads per step) and the matching x once for
// all R rows. Partial sums: a warp sum, then the warps' partials in warp order (fixed order: the result of a
// token does not depend on n_tok or on the grid). NT: the tokens the accumulators hold (1, or kGemvMaxTok
// with n_tok <= NT at run time). Tried and dropped (session 9, H200): each group prefetching the CTA's next
// group into L2 raised the K3 slice's GEMV DRAM bytes from 8.06 to 11.5 GB and its B = 1 step from 2.73 to
// 3.52 ms.
template <WK K, bool VEC, int R, int NT>
__global__ void __launch_bounds__(kGemvThreads, NT == 1 && R == 1 ? 8 : 1)  // 1-row: 8 CTAs per SM
    gemv_kernel(const __grid_constant__ GemvArgs a) {
  constexpr int kWarps = kGemvThreads / 32;
  __shared__ float part[kWarps][R * NT];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int n_tok = NT == 1 ? 1 : a.n_tok;
  const int64_t n_group = (a.out + R - 1) / R;
  // PDL (gemv_launch): the weights do not depend on earlier kernels, so while the previous kernel finishes
  // this CTA asks L2 for its first group's rows; x and y only after pdl_wait.
  pdl_launch_dependents();
  if (blockIdx.x < n_group)
    for (int r = 0; r < R; ++r) {
      const int64_t o = std::min<int64_t>(int64_t(blockIdx.x) * R + r, a.out - 1);
      const GemvSeg& s = seg_of(a, o);
      const char* row = static_cast<const char*>(s.w) + (o - s.row0) * a.row_bytes;
      for (int64_t b = int64_t(threadIdx.x) * 128; b < a.row_bytes; b += int64_t(kGemvThreads) * 128)
        asm volatile("prefetch.global.L2 [%0];" ::"l"(row + b));
    }
  pdl_wait();
  for (int64_t g = blockIdx.x; g < n_group; g += gridDim.x) {
    const int64_t o0 = g * R;
    int64_t row[R];  // a short last group re-reads its last row and drops the sums
#pragma unroll
    for (int r = 0; r < R; ++r) row[r] = o0 + r < a.out ? o0 + r : a.out - 1;
    float acc[R][NT];
#pragma unroll
    for (int r = 0; r < R; ++r)
#pragma unroll
      for (int t = 0; t < NT; ++t) acc[r][t] = 0.f;
    if constexpr (VEC) {
      using T = typename Chunk<K>::T;
      constexpr int E = Chunk<K>::E;
      const T* wrow[R];
      const uint8_t* srow[R];
#pragma unroll
      for (int r = 0; r < R; ++r) {
        const GemvSeg& s = seg_of(a, row[r]);
        const int64_t o = row[r] - s.row0;
        wrow[r] = reinterpret_cast<const T*>(static_cast<const uint8_t*>(s.w) + o * a.row_bytes);
        srow[r] = K == WK::mxfp4 ? s.scale + o * (a.in / 32) : nullptr;
      }
      const int64_t n_chunk = a.in / E;
#pragma unroll(R == 1 ? 4 : 2)  // loads in flight per thread: 4 (R = 1) or 8
      for (int64_t v = threadIdx.x; v < n_chunk; v += kGemvThreads) {
        T raw[R];
#pragma unroll
        for (int r = 0; r < R; ++r) raw[r] = __ldg(wrow[r] + v);
        float w[R][E], sc[R];
#pragma unroll
        for (int r = 0; r < R; ++r) {
          decode_chunk<K>(raw[r], w[r]);
          sc[r] = K == WK::mxfp4 ? e8m0(__ldg(srow[r] + v * E / 32)) : 1.f;
        }
#pragma unroll
        for (int t = 0; t < NT; ++t) {
          if (t >= n_tok) break;
          const float* xt = a.x + t * a.ldx + v * E;
          float x[E];
          if (a.x_vec) {
#pragma unroll
            for (int e = 0; e < E; e += 4) {
              const float4 xv = *reinterpret_cast<const float4*>(xt + e);
              x[e] = xv.x, x[e + 1] = xv.y, x[e + 2] = xv.z, x[e + 3] = xv.w;
            }
          } else {
#pragma unroll
            for (int e = 0; e < E; ++e) x[e] = xt[e];
          }
#pragma unroll
          for (int r = 0; r < R; ++r) {
            float p = 0.f;
#pragma unroll
            for (int e = 0; e < E; e += 4)
              p += w[r][e] * x[e] + w[r][e + 1] * x[e + 1] + w[r][e + 2] * x[e + 2] + w[r][e + 3] * x[e + 3];
            acc[r][t] += K == WK::mxfp4 ? p * sc[r] : p;
          }
        }
      }
    } else {
      const void* w_of[R];
      const uint8_t* s_of[R];
      int64_t o_of[R];
#pragma unroll
      for (int r = 0; r < R; ++r) {
        const GemvSeg& s = seg_of(a, row[r]);
        w_of[r] = s.w, s_of[r] = s.scale, o_of[r] = row[r] - s.row0;
      }
      for (int64_t c = threadIdx.x; c < a.in; c += kGemvThreads) {
#pragma unroll
        for (int r = 0; r < R; ++r) {
          const float w = weight_at<K>(w_of[r], s_of[r], a.in, o_of[r], c);
#pragma unroll
          for (int t = 0; t < NT; ++t)
            if (t < n_tok) acc[r][t] += w * a.x[t * a.ldx + c];
        }
      }
    }
#pragma unroll
    for (int r = 0; r < R; ++r)
#pragma unroll
      for (int t = 0; t < NT; ++t) {
        if (t >= n_tok) break;
        const float s = warp_sum(acc[r][t]);
        if (lane == 0) part[warp][r * NT + t] = s;
      }
    __syncthreads();
    if (threadIdx.x < R * NT) {
      const int r = threadIdx.x / NT, t = threadIdx.x % NT;
      if (t < n_tok && o0 + r < a.out) {
        float s = 0.f;
#pragma unroll
        for (int q = 0; q < kWarps; ++q) s += part[q][threadIdx.x];
        const GemvSeg& sg = seg_of(a, o0 + r);
        sg.y[t * sg.ldy + (o0 + r - sg.row0)] = sg.round ? round_bf16_dev(s) : s;
      }
    }
    __syncthreads();  // part is rewritten by the next group
  }
}

// Short rows (at most 32 loads, e.g. KDA's f_b_proj [12288, 128]), where gemv_kernel's 256 threads per row
// group would mostly idle through its two barriers per group: TPR lanes per row (16 or 32), one load each,
// 256 / TPR rows per CTA, the row's sum by shuffles within its lanes (a fixed order: a token's result does
// not depend on n_tok or the grid). The weights are loaded and decoded before pdl_wait.
template <WK K, int TPR, int NT>
__global__ void __launch_bounds__(kGemvThreads) gemv_short_kernel(const __grid_constant__ GemvArgs a) {
  using T = typename Chunk<K>::T;
  constexpr int E = Chunk<K>::E;
  pdl_launch_dependents();
  const int64_t o = int64_t(blockIdx.x) * (kGemvThreads / TPR) + threadIdx.x / TPR;
  const int c = int(threadIdx.x % TPR);
  const bool live = o < a.out && c < a.in / E;
  const GemvSeg& s = seg_of(a, o < a.out ? o : a.out - 1);
  const int64_t r = (o < a.out ? o : a.out - 1) - s.row0;
  T raw{};
  float sc = 1.f;
  if (live) {
    raw = __ldg(reinterpret_cast<const T*>(static_cast<const uint8_t*>(s.w) + r * a.row_bytes) + c);
    if constexpr (K == WK::mxfp4) sc = e8m0(__ldg(s.scale + r * (a.in / 32) + c * E / 32));
  }
  float w[E];
  decode_chunk<K>(raw, w);
  pdl_wait();
  const int n_tok = NT == 1 ? 1 : a.n_tok;
  float acc[NT];
#pragma unroll
  for (int t = 0; t < NT; ++t) {
    acc[t] = 0.f;
    if (!live || t >= n_tok) continue;
    const float* xt = a.x + t * a.ldx + int64_t(c) * E;
    float p = 0.f;
#pragma unroll
    for (int e = 0; e < E; ++e) p += w[e] * xt[e];
    acc[t] = K == WK::mxfp4 ? p * sc : p;
  }
#pragma unroll
  for (int t = 0; t < NT; ++t)
#pragma unroll
    for (int off = TPR / 2; off > 0; off >>= 1) acc[t] += __shfl_xor_sync(0xffffffffu, acc[t], off);
  if (c == 0 && o < a.out)
#pragma unroll
    for (int t = 0; t < NT; ++t)
      if (t < n_tok) s.y[t * s.ldy + r] = s.round ? round_bf16_dev(acc[t]) : acc[t];
}

// dst[r, c] = W[r0 + r, c] for r < n_rows, as fp32 or bf16 (exact for the dtypes routed here).
template <WK K, class T>
__global__ void decode_rows_kernel(const void* w, const uint8_t* scale, int64_t in, int64_t r0,
                                   int64_t n_rows, T* dst) {
  const int64_t e = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (e >= n_rows * in) return;
  const float v = weight_at<K>(w, scale, in, r0 + e / in, e % in);
  if constexpr (sizeof(T) == 2)
    dst[e] = __float2bfloat16_rn(v);
  else
    dst[e] = v;
}

// xb[t, i] = bf16(x[t, i]) for i < in, 0 up to ldb (x is bf16-exact in bf16 mode, so this is exact).
__global__ void x_to_bf16_kernel(const float* x, int64_t ldx, int64_t in, int64_t n_tok, int64_t ldb,
                                 __nv_bfloat16* xb) {
  const int64_t e = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (e >= n_tok * ldb) return;
  const int64_t t = e / ldb, i = e % ldb;
  xb[e] = __float2bfloat16_rn(i < in ? x[t * ldx + i] : 0.f);
}

// y[t, o] = bf16(y[t, o]) for o < out (kept in fp32)
__global__ void round_rows_kernel(float* y, int64_t ldy, int64_t out, int64_t n_tok) {
  const int64_t e = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (e >= n_tok * out) return;
  float& v = y[(e / out) * ldy + e % out];
  v = round_bf16_dev(v);
}

WK kind_of(const LinearWeight& W) {
  if (W.is_mxfp4()) return WK::mxfp4;
  switch (W.dtype) {
    case DType::f32:
      return WK::f32;
    case DType::bf16:
      return WK::bf16;
    case DType::f16:
      return WK::f16;
    case DType::f8_e4m3:
      return WK::fp8;
    default:
      K3_ASSERT(!"linear_cuda: unsupported weight dtype");
  }
  return WK::f32;
}

// CTAs of gemv_kernel<K, VEC, R, NT> the whole device holds at once
template <WK K, bool VEC, int R, int NT>
int64_t gemv_slots() {
  static const int64_t slots = [] {
    int per_sm = 0;
    K3_CUDA_ASSERT(
        cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, gemv_kernel<K, VEC, R, NT>, kGemvThreads, 0));
    return int64_t(std::max(per_sm, 1)) * device_sm_count();
  }();
  return slots;
}

// One resident wave of CTAs, each striding over row groups, launched with PDL (K3_PDL=0: without): a GEMV's
// CTAs start on the SMs the previous kernel leaves and fetch weights while it drains. R = 4 rows per group (4
// loads in flight per thread and step, x read once for 4 rows) when the groups fill that wave's CTAs in whole
// rounds (at most 4% of the last round idle); otherwise 1 row per group: out = 12288 over 6 x 132 CTAs of one
// row each leaves 3% idle, where one warp per row (sessions 1-6) left 1.45 waves of 8-row CTAs: 0.65 of copy
// at batch 1.
template <WK K, bool VEC, int NT>
void gemv_launch(const GemvArgs& a, GpuContext& g) {
  static const bool pdl = env_switch("K3_PDL", true);
  constexpr int E = Chunk<K>::E;
  if constexpr (VEC) {
    if (a.in / E <= 32) {  // short rows: gemv_short_kernel
      const int tpr = a.in / E <= 16 ? 16 : 32;
      const unsigned grid = unsigned((a.out * tpr + kGemvThreads - 1) / kGemvThreads);
      if (tpr == 16)
        launch_pdl(pdl, gemv_short_kernel<K, 16, NT>, dim3(grid), dim3(kGemvThreads), 0, g.stream, a);
      else
        launch_pdl(pdl, gemv_short_kernel<K, 32, NT>, dim3(grid), dim3(kGemvThreads), 0, g.stream, a);
      return;
    }
  }
  const int64_t slots4 = gemv_slots<K, VEC, 4, NT>(), groups4 = (a.out + 3) / 4;
  const int64_t rounds4 = (groups4 + slots4 - 1) / slots4;
  if (groups4 >= slots4 && rounds4 * slots4 * 25 <= groups4 * 26) {
    launch_pdl(pdl, gemv_kernel<K, VEC, 4, NT>, dim3(unsigned(slots4)), dim3(kGemvThreads), 0, g.stream, a);
  } else {
    const int64_t slots1 = gemv_slots<K, VEC, 1, NT>();
    launch_pdl(pdl, gemv_kernel<K, VEC, 1, NT>, dim3(unsigned(std::min(a.out, slots1))), dim3(kGemvThreads),
               0, g.stream, a);
  }
}

template <WK K>
void gemv(const GemvArgs& a, bool vec, GpuContext& g) {
  if (!vec)  // rows not aligned to the load width: the scalar loop, any n_tok <= kGemvMaxTok
    gemv_launch<K, false, kGemvMaxTok>(a, g);
  else if (a.n_tok == 1)
    gemv_launch<K, true, 1>(a, g);
  else
    gemv_launch<K, true, kGemvMaxTok>(a, g);
}

size_t load_bytes(WK k) {  // sizeof(Chunk<K>::T)
  return k == WK::fp8 ? 8 : k == WK::mxfp4 ? 4 : 16;
}
int64_t row_bytes(WK k, int64_t in) {
  return k == WK::mxfp4 ? in / 2 : in * int64_t(k == WK::f32 ? 4 : k == WK::fp8 ? 1 : 2);
}

// y_i = W_i x for i < n in one GEMV launch: n <= kGemvMaxSeg weights of kind k and one `in`, every p[i] with
// p[0]'s x, ldx and n_tok <= kGemvMaxTok.
void gemv_group(WK k, const LinearWeight* const* W, const LinearParams* p, int n, GpuContext& g) {
  GemvArgs a{};
  a.n_seg = n, a.in = W[0]->in, a.row_bytes = row_bytes(k, a.in);
  a.x = p[0].x, a.ldx = p[0].ldx ? p[0].ldx : a.in, a.n_tok = int(p[0].n_tok);
  a.x_vec = reinterpret_cast<uintptr_t>(a.x) % 16 == 0 && a.ldx % 4 == 0;
  bool vec = a.row_bytes % int64_t(load_bytes(k)) == 0;
  for (int i = 0; i < n; ++i) {
    a.seg[i] = GemvSeg{W[i]->w, W[i]->scale, p[i].y,         p[i].ldy ? p[i].ldy : W[i]->out,
                       a.out,   W[i]->out,   p[i].round_bf16};
    a.out += W[i]->out;
    vec = vec && reinterpret_cast<uintptr_t>(W[i]->w) % load_bytes(k) == 0;
  }
  switch (k) {
    case WK::f32:
      return gemv<WK::f32>(a, vec, g);
    case WK::bf16:
      return gemv<WK::bf16>(a, vec, g);
    case WK::f16:
      return gemv<WK::f16>(a, vec, g);
    case WK::fp8:
      return gemv<WK::fp8>(a, vec, g);
    case WK::mxfp4:
      return gemv<WK::mxfp4>(a, vec, g);
  }
}

template <WK K, class T>
void decode_rows(const LinearWeight& W, int64_t r0, int64_t n_rows, T* dst, GpuContext& g) {
  decode_rows_kernel<K, T>
      <<<blocks_for(n_rows * W.in, 256), 256, 0, g.stream>>>(W.w, W.scale, W.in, r0, n_rows, dst);
  K3_CUDA_LAUNCH_CHECK();
}

template <class T>
void decode_rows_any(WK k, const LinearWeight& W, int64_t r0, int64_t n_rows, T* dst, GpuContext& g) {
  switch (k) {
    case WK::f32:
      decode_rows<WK::f32>(W, r0, n_rows, dst, g);
      break;
    case WK::bf16:
      decode_rows<WK::bf16>(W, r0, n_rows, dst, g);
      break;
    case WK::f16:
      decode_rows<WK::f16>(W, r0, n_rows, dst, g);
      break;
    case WK::fp8:
      decode_rows<WK::fp8>(W, r0, n_rows, dst, g);
      break;
    case WK::mxfp4:
      decode_rows<WK::mxfp4>(W, r0, n_rows, dst, g);
      break;
  }
}

// C [m, n] (ldc) = A^T B: A [k, m] (lda = k), B [k, n] (ldb), all fp32, fp32 arithmetic (TF32 only if
// allowed). A library without the pedantic compute type for this call falls back to cublasSgemm, which the
// context's math mode (CUBLAS_DEFAULT_MATH unless allow_tf32) keeps in true fp32.
void fp32_gemm(cublasHandle_t h, int m, int n, int k, const float* A, const float* B, int ldb, float* C,
               int ldc, bool allow_tf32) {
  const float alpha = 1.f, beta = 0.f;
  const cublasStatus_t st = cublasGemmEx(
      h, CUBLAS_OP_T, CUBLAS_OP_N, m, n, k, &alpha, A, CUDA_R_32F, k, B, CUDA_R_32F, ldb, &beta, C,
      CUDA_R_32F, ldc, allow_tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F_PEDANTIC,
      CUBLAS_GEMM_DEFAULT);
  if (st != CUBLAS_STATUS_NOT_SUPPORTED) {
    K3_CUBLAS_ASSERT(st);
    return;
  }
  K3_CUBLAS_ASSERT(cublasSgemm(h, CUBLAS_OP_T, CUBLAS_OP_N, m, n, k, &alpha, A, k, B, ldb, &beta, C, ldc));
}

void gemm(WK k, const LinearWeight& W, const LinearParams& p, int64_t ldx, int64_t ldy, GpuContext& g) {
  auto* h = static_cast<cublasHandle_t>(g.cublas);
  K3_ASSERT(h != nullptr);
  K3_CUBLAS_ASSERT(cublasSetStream(h, g.stream));
  K3_ASSERT(W.in < (int64_t(1) << 31) && W.out < (int64_t(1) << 31) && ldx < (int64_t(1) << 31) &&
            ldy < (int64_t(1) << 31));
  const bool bf16 = p.x_precision == Precision::bf16 && (k == WK::bf16 || k == WK::fp8 || k == WK::mxfp4);
  const size_t esz = bf16 ? 2 : 4;
  char* ws = static_cast<char*>(g.workspace);
  size_t ws_left = g.workspace_bytes;
  // the bf16 copy of x: every token if it fits in half the workspace, else token tiles
  const int64_t ldb = (W.in + 7) / 8 * 8;
  int64_t tok_tile = p.n_tok;
  __nv_bfloat16* xb = nullptr;
  if (bf16) {
    tok_tile = std::min<int64_t>(p.n_tok, int64_t(g.workspace_bytes / 2 / size_t(ldb * 2)));
    K3_ASSERT(tok_tile >= 1 && "linear_cuda: GPU workspace too small for one bf16 row of x");
    xb = reinterpret_cast<__nv_bfloat16*>(ws);
    const size_t used = (size_t(tok_tile * ldb * 2) + 255) / 256 * 256;
    ws += used, ws_left -= used;
  }
  // W row tiles (a multiple of 64 rows when possible); f32 weights in fp32 mode and bf16 weights in bf16
  // mode are used in place
  const bool in_place = (!bf16 && k == WK::f32) || (bf16 && k == WK::bf16);
  int64_t row_tile = W.out;
  if (!in_place) {
    row_tile = std::min<int64_t>(W.out, int64_t(ws_left / (size_t(W.in) * esz)));
    if (row_tile > 64) row_tile = row_tile / 64 * 64;
    K3_ASSERT(row_tile >= 1 && "linear_cuda: GPU workspace too small for one decoded weight row");
  }
  const float alpha = 1.f, beta = 0.f;
  for (int64_t t0 = 0; t0 < p.n_tok; t0 += tok_tile) {
    const int64_t nt = std::min(tok_tile, p.n_tok - t0);
    if (bf16) {
      x_to_bf16_kernel<<<blocks_for(nt * ldb, 256), 256, 0, g.stream>>>(p.x + t0 * ldx, ldx, W.in, nt, ldb,
                                                                        xb);
      K3_CUDA_LAUNCH_CHECK();
    }
    for (int64_t r0 = 0; r0 < W.out; r0 += row_tile) {
      const int64_t nr = std::min(row_tile, W.out - r0);
      const void* A = nullptr;
      if (in_place && k == WK::f32) {
        A = static_cast<const float*>(W.w) + r0 * W.in;
      } else if (in_place) {
        A = static_cast<const uint16_t*>(W.w) + r0 * W.in;
      } else if (bf16) {
        decode_rows_any(k, W, r0, nr, reinterpret_cast<__nv_bfloat16*>(ws), g);
        A = ws;
      } else {
        decode_rows_any(k, W, r0, nr, reinterpret_cast<float*>(ws), g);
        A = ws;
      }
      float* C = p.y + t0 * ldy + r0;
      if (bf16)
        K3_CUBLAS_ASSERT(cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, int(nr), int(nt), int(W.in), &alpha, A,
                                      CUDA_R_16BF, int(W.in), xb, CUDA_R_16BF, int(ldb), &beta, C, CUDA_R_32F,
                                      int(ldy), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
      else
        fp32_gemm(h, int(nr), int(nt), int(W.in), static_cast<const float*>(A), p.x + t0 * ldx, int(ldx), C,
                  int(ldy), g.allow_tf32);
    }
  }
}

}  // namespace

void linear_cuda(const LinearWeight& W, const LinearParams& p, GpuContext& g) {
  K3_ASSERT(!W.is_mxfp4() || W.in % 32 == 0);
  if (W.in <= 0) {  // a weight that was never loaded: name its shape before stopping
    std::fprintf(stderr, "k3: linear_cuda on an empty weight [%lld, %lld] (n_tok %lld)\n", (long long)W.out,
                 (long long)W.in, (long long)p.n_tok);
    K3_ASSERT(W.in > 0);
  }
  if (p.n_tok <= 0 || W.out <= 0) return;
  const int64_t ldx = p.ldx ? p.ldx : W.in, ldy = p.ldy ? p.ldy : W.out;
  const WK k = kind_of(W);
  if (p.n_tok > kGemvMaxTok) {
    gemm(k, W, p, ldx, ldy, g);
    if (p.round_bf16) {
      round_rows_kernel<<<blocks_for(p.n_tok * W.out, 256), 256, 0, g.stream>>>(p.y, ldy, W.out, p.n_tok);
      K3_CUDA_LAUNCH_CHECK();
    }
    return;
  }
  const LinearWeight* w = &W;
  gemv_group(k, &w, &p, 1, g);
}

void linear_group_cuda(const LinearWeight* const* W, const LinearParams* p, int n, GpuContext& g) {
  if (n <= 0) return;
  bool one = n <= kGemvMaxSeg && p[0].n_tok <= kGemvMaxTok && W[0]->in > 0;
  for (int i = 0; i < n && one; ++i)
    one = p[i].n_tok == p[0].n_tok && p[i].x == p[0].x && p[i].ldx == p[0].ldx && W[i]->in == W[0]->in &&
          W[i]->out > 0 && kind_of(*W[i]) == kind_of(*W[0]);
  if (!one || p[0].n_tok <= 0) {
    for (int i = 0; i < n; ++i) linear_cuda(*W[i], p[i], g);
    return;
  }
  gemv_group(kind_of(*W[0]), W, p, n, g);
}

}  // namespace k3
