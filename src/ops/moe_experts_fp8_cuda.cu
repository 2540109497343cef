// moe_experts_fp8_cuda.cu: the routed experts' decode (n_tok <= kMoeDecodeMaxTok) on fp8 warpgroup MMAs
// (moe_experts.h; the rules in moe_experts_layout.h, "the fp8 warpgroup-MMA decode kernel").
//
// Why: the bf16 decode kernel (moe_experts_cuda.cu) spends ~3.4 instructions per weight (the nibble-pair
// decode, the scale multiply, its loads) and is issue-bound at ~0.5 of the copy rate. An e2m1 nibble becomes
// an e4m3 byte by shifts and masks (moe::f8_even / f8_odd: 7 operations per 8 weights) and the Hopper
// tensor core multiplies e4m3 natively in warpgroup MMAs with A in registers (mma.sync e4m3 on sm_90 is
// compiled to conversions plus an f16 MMA), so a weight costs ~1 instruction. The E8M0 scale moves to fp32
// partial sums: each MMA column sums one group of 32 columns.
//
//   image  (fp8_image_kernel, once per call and input): every row's groups of 32 activations split exactly
//          into e4m3 hi + lo / 16 times a power of two (moe::fp8_split), laid out as the zero-padded B blocks of
//          the MMAs (moe::fp8_b_off), and the groups' factors.
//   decode (experts_decode_fp8_kernel): tiles of <= T sorted rows of one expert (sort_kernel with BT = T); a
//          block is one warpgroup on (tile, 64 weight rows: 32 neurons' gate rows in warps 0-1 and up rows in
//          warps 2-3, or 64 down rows) over the whole reduction. Per 128-column chunk, lane (g, q) loads the
//          16 bytes of group q of its rows g, g + 8 (and their exponents); word i of them is the A fragment
//          of one m64n(8T)k32 MMA (a0 / a2 = f8_even / f8_odd of row g, a1 / a3 of row g + 8) whose B block
//          (staged per tile in shared memory) has, per token, the columns (group, hi / lo). So lane (g, q)'s
//          accumulators are its own group's (rows g, g + 8) x (token, part) sums: it scales them by its
//          exponents and the factors into fp32 sums once the chunk's 4 MMAs retire (two register sets: the
//          next chunk's decode and MMAs run meanwhile). Weight loads run DEPTH chunks ahead.
// Numerics: the image is exact but for activations 2^13 below their group's largest; the tensor core adds
// each chunk's 32 products per column in its fp8 accumulation; chunk sums scaled exactly, added in fp32.
#include <cuda_bf16.h>

#include "ops/mla_wgmma.cuh"
#include "ops/moe_experts_cuda.cuh"

namespace k3::moe_cuda {
namespace {

using namespace cuda_ops;
using mla_detail::fence_proxy_async;
using mla_detail::fence_regs;
using mla_detail::wgmma_commit;
using mla_detail::wgmma_fence;

constexpr int kQThreads = 128;  // one warpgroup
constexpr int kBlockB = 256;    // bytes of one token's B block (2 core matrices of 8 x 16)

// d (64 x 8T fp32) = (scale_d ? d : 0) + A (64 x 32 e4m3, registers) B (32 x 8T e4m3, K-major, no swizzle)
template <int T>
struct Q8;
template <>
struct Q8<1> {
  static __device__ __forceinline__ void mma(float (&d)[4], const uint32_t (&a)[4], uint64_t b, int sd) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %9, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n8k32.f32.e4m3.e4m3 {%0, %1, %2, %3}, {%4, %5, %6, %7}, %8, p, 1, 1;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(sd));
  }
};
template <>
struct Q8<2> {
  static __device__ __forceinline__ void mma(float (&d)[8], const uint32_t (&a)[4], uint64_t b, int sd) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %13, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n16k32.f32.e4m3.e4m3 {%0, %1, %2, %3, %4, %5, %6, %7}, "
        "{%8, %9, %10, %11}, %12, p, 1, 1;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(sd));
  }
};
template <>
struct Q8<4> {
  static __device__ __forceinline__ void mma(float (&d)[16], const uint32_t (&a)[4], uint64_t b, int sd) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %21, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n32k32.f32.e4m3.e4m3 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, "
        "%11, %12, %13, %14, %15}, {%16, %17, %18, %19}, %20, p, 1, 1;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
          "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(sd));
  }
};

// K-major, no swizzle: LBO = bytes between the two core matrices along K, SBO = between 8-row groups (tokens)
__device__ __forceinline__ uint64_t desc_plain(uint32_t smem_addr, uint32_t lbo, uint32_t sbo) {
  return uint64_t((smem_addr & 0x3FFFF) >> 4) | (uint64_t(lbo >> 4) << 16) | (uint64_t(sbo >> 4) << 32);
}

// One thread per (row, chunk, group slot G4 < 4): x = bf16(z) (z fp32, row stride ldz) or h (bf16, natural
// order) -> its 16 B-block rows (word i, core h, part p) and the group's factors (fx, groups < G only).
__global__ void fp8_image_kernel(const float* z, int64_t ldz, const __nv_bfloat16* hsrc, int64_t n_rows, int K,
                                 uint8_t* img, float2* fx) {
  const int G = K / 32, n_chunk = (K + moe::kChunk - 1) / moe::kChunk;
  const int64_t id = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (id >= n_rows * n_chunk * 4) return;
  const int64_t r = id / (n_chunk * 4);
  const int c = int(id / 4 % n_chunk), G4 = int(id % 4), grp = c * 4 + G4;
  uint8_t hi[32] = {}, lo[32] = {};
  if (grp < G) {
    float x[32], f[2];
    for (int k = 0; k < 32; ++k)
      x[k] = z ? round_bf16_dev(z[r * ldz + grp * 32 + k]) : __bfloat162float(hsrc[r * K + grp * 32 + k]);
    moe::fp8_split(x, hi, lo, f);
    fx[r * G + grp] = make_float2(f[0], f[1]);
  }
  uint8_t* base = img + r * int64_t(n_chunk) * 4 * kBlockB;
#pragma unroll
  for (int i = 0; i < 4; ++i)
#pragma unroll
    for (int h = 0; h < 2; ++h)
#pragma unroll
      for (int p = 0; p < 2; ++p) {
        const uint8_t* src = p ? lo : hi;
        uint32_t wd = 0;
#pragma unroll
        for (int j = 0; j < 4; ++j) wd |= uint32_t(src[8 * i + 2 * j + h]) << (8 * j);
        uint4 row = make_uint4(0, 0, 0, 0);
        (&row.x)[G4] = wd;
        *reinterpret_cast<uint4*>(base + moe::fp8_b_off(c, i, h, G4, p, 0) - 4 * G4) = row;
      }
}

struct QLoads {  // one lane's loads of one chunk: group q of rows g, g + 8, their exponents
  uint4 w[2];
  uint32_t ex[2];
};

template <int T>
size_t q_smem_bytes(int K) {
  const int n_chunk = (K + moe::kChunk - 1) / moe::kChunk;
  return size_t(n_chunk) * 4 * T * kBlockB + size_t(T) * (K / 32) * 8 + 2 * 32 * 2 * T * 4;
}

// T: rows per tile (1, 2 or 4: lane q of a row writes token q); DEPTH: chunks of weight loads in flight (1 or 3)
template <bool DUAL, int T, int DEPTH>
__global__ void __launch_bounds__(kQThreads, T == 4 ? 2 : 4) experts_decode_fp8_kernel(GemmArgs a, const uint8_t* bimg,
                                                                          const float2* fx) {
  constexpr int R = DEPTH + 1;  // load ring (even: the MMA register sets alternate with the chunk's parity)
  static_assert(R % 2 == 0, "ring of 2 or 4");
  extern __shared__ __align__(128) uint8_t q_smem[];
  const int tid = threadIdx.x, lane = tid & 31, w = tid >> 5, g = lane >> 2, q = lane & 3;
  const int4 ti = a.tiles[blockIdx.x];  // (expert, first sorted row, rows <= T)
  if (ti.x < 0) return;
  const int r0 = ti.y, n_r = ti.z, K = a.K, G = K / 32, n_chunk = (K + moe::kChunk - 1) / moe::kChunk;
  uint8_t* s_b = q_smem;                                                       // [n_chunk][4][T][256]
  float2* s_fx = reinterpret_cast<float2*>(s_b + size_t(n_chunk) * 4 * T * kBlockB);  // [T][G]
  float* s_up = reinterpret_cast<float*>(s_fx + T * G);                        // [2][32][2 T]
  const MoeExpertPtrs ep = a.experts[ti.x];
  // this warp's 16 rows: gate / up of neurons n0 + 16 (w % 2) .. (DUAL), or down rows n0 + 16 w ..
  const int n0 = blockIdx.y * (DUAL ? 32 : 64), rb = DUAL ? n0 + 16 * (w & 1) : n0 + 16 * w;
  const uint8_t* wm = DUAL ? (w < 2 ? ep.w1 : ep.w3) : ep.w2;
  const uint8_t* sm = DUAL ? (w < 2 ? ep.s1 : ep.s3) : ep.s2;
  const uint8_t* wr[2];
  const uint8_t* sr[2];
  bool okr[2];
#pragma unroll
  for (int k = 0; k < 2; ++k) {
    const int row = rb + g + 8 * k;
    okr[k] = row < a.n_out;
    wr[k] = wm + (okr[k] ? size_t(row) * (K / 2) + q * 16 : 0);
    sr[k] = sm + (okr[k] ? size_t(row) * (K / 32) + q : 0);
  }
  QLoads buf[R];
  auto load = [&](int c, QLoads& d) {
    const bool ok = c < n_chunk && c * moe::kChunk + q * 32 < K;
#pragma unroll
    for (int k = 0; k < 2; ++k) {
      const bool on = ok && okr[k];
      d.w[k] = on ? __ldg(reinterpret_cast<const uint4*>(wr[k] + size_t(c) * 64)) : make_uint4(0, 0, 0, 0);
      d.ex[k] = on ? __ldg(sr[k] + c * 4) : 127u;
    }
  };
#pragma unroll
  for (int i = 0; i < DEPTH; ++i) load(i, buf[i]);  // in flight while the B blocks are staged
  for (int t = 0; t < n_r; ++t) {
    const int64_t ir = DUAL ? a.order[r0 + t] / a.k : r0 + t;  // image row: token (gate / up), sorted row
    const uint8_t* src = bimg + ir * int64_t(n_chunk) * 4 * kBlockB;
    for (int u = tid; u < n_chunk * 4 * 16; u += kQThreads)  // 16-byte unit u of block u / 16
      cp_async16(s_b + (size_t(u >> 4) * T + t) * kBlockB + (u & 15) * 16, src + size_t(u) * 16, true);
    for (int i = tid; i < G; i += kQThreads) s_fx[t * G + i] = fx[ir * G + i];
  }
  cp_async_commit();
  cp_async_wait_all();
  fence_proxy_async();
  __syncthreads();
  const uint32_t b_addr = static_cast<uint32_t>(__cvta_generic_to_shared(s_b));
  float acc[T][2] = {};     // rows g, g + 8 of each token, this lane's groups
  uint32_t fa[2][4][4];     // [chunk parity][word i][a0..a3]
  float cs[2][4 * T];       // [chunk parity]: d[4 t + e] = row g + 8 (e / 2), token t, part e % 2 (group q)
  float ws[2][2];           // [chunk parity]: 2^(e - 127) of rows g, g + 8
  auto scale = [&](int par, int c) {  // chunk c's sums (register set par) into acc
    const int grp = c * 4 + q;
#pragma unroll
    for (int t = 0; t < T; ++t) {
      const float2 f = grp < G && t < n_r ? s_fx[t * G + grp] : make_float2(0.f, 0.f);
#pragma unroll
      for (int k = 0; k < 2; ++k)
        acc[t][k] = fmaf(fmaf(cs[par][4 * t + 2 * k], f.x, cs[par][4 * t + 2 * k + 1] * f.y), ws[par][k], acc[t][k]);
    }
  };
  for (int c0 = 0; c0 < n_chunk; c0 += R) {
#pragma unroll
    for (int j = 0; j < R; ++j) {
      const int c = c0 + j, par = j & 1;
      if (c >= n_chunk) break;  // block-uniform
      const QLoads& d = buf[j];
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const uint32_t w0 = (&d.w[0].x)[i], w1 = (&d.w[1].x)[i];
        fa[par][i][0] = moe::f8_even(w0), fa[par][i][1] = moe::f8_even(w1);
        fa[par][i][2] = moe::f8_odd(w0), fa[par][i][3] = moe::f8_odd(w1);
      }
#pragma unroll
      for (int k = 0; k < 2; ++k) ws[par][k] = __uint_as_float(moe::e8m0_f32_bits(d.ex[k]));
      wgmma_fence();
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const uint64_t dsc = desc_plain(b_addr + uint32_t((c * 4 + i) * T) * kBlockB, 128, kBlockB);
        Q8<T>::mma(cs[par], fa[par][i], dsc, i > 0);
      }
      wgmma_commit();
      load(c + DEPTH, buf[(j + DEPTH) % R]);  // the slot chunk c - 1 used (its exponents are in ws)
      mla_detail::wgmma_wait<1>();            // chunk c - 1's MMAs are done: its registers are free
      fence_regs(cs[par ^ 1]);
#pragma unroll
      for (int i = 0; i < 4; ++i) fence_regs(fa[par ^ 1][i]);
      if (c > 0) scale(par ^ 1, c - 1);
    }
  }
  mla_detail::wgmma_wait0();
  fence_regs(cs[0]), fence_regs(cs[1]);
  if ((n_chunk - 1) & 1)  // static register sets: no runtime index into cs
    scale(1, n_chunk - 1);
  else
    scale(0, n_chunk - 1);
  // the 4 lanes of a row hold its 4 groups' sums: add them (every lane gets the total)
#pragma unroll
  for (int t = 0; t < T; ++t)
#pragma unroll
    for (int k = 0; k < 2; ++k) {
      acc[t][k] += __shfl_xor_sync(0xffffffffu, acc[t][k], 1);
      acc[t][k] += __shfl_xor_sync(0xffffffffu, acc[t][k], 2);
    }
  float v[2] = {0.f, 0.f};  // token q's rows g, g + 8
#pragma unroll
  for (int t = 0; t < T; ++t)
    if (t == q) v[0] = acc[t][0], v[1] = acc[t][1];
  if constexpr (DUAL) {  // warps 2, 3 hand their up sums to warps 0, 1
    if (w >= 2) s_up[((w - 2) * 32 + lane) * 2] = v[0], s_up[((w - 2) * 32 + lane) * 2 + 1] = v[1];
    __syncthreads();
    if (w >= 2 || q >= n_r) return;
#pragma unroll
    for (int k = 0; k < 2; ++k) {
      const int neuron = rb + g + 8 * k;
      if (neuron >= a.n_out) continue;
      const float gv = round_bf16_dev(v[k]), uv = round_bf16_dev(s_up[(w * 32 + lane) * 2 + k]);
      a.out[size_t(r0 + q) * a.n_out + neuron] = __float2bfloat16_rn(act_dev(a.act, gv, uv, a.beta1, a.beta2));
    }
  } else {
    if (q >= n_r) return;
    const size_t orow = size_t(a.order[r0 + q]) * a.n_out;
#pragma unroll
    for (int k = 0; k < 2; ++k)
      if (rb + g + 8 * k < a.n_out) a.out[orow + rb + g + 8 * k] = __float2bfloat16_rn(v[k]);
  }
}

template <int T, int DEPTH>
void launch_q(const GemmArgs& a, const uint8_t* bimg, const float2* fx, bool dual, unsigned max_tiles,
              cudaStream_t stream) {
  auto k = dual ? experts_decode_fp8_kernel<true, T, DEPTH> : experts_decode_fp8_kernel<false, T, DEPTH>;
  const size_t smem = q_smem_bytes<T>(a.K);
  K3_CUDA_ASSERT(cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
  const int rows = dual ? 32 : 64;
  const dim3 grid(max_tiles, unsigned((a.n_out + rows - 1) / rows));
  k<<<grid, kQThreads, smem, stream>>>(a, bimg, fx);
  K3_CUDA_LAUNCH_CHECK();
}

}  // namespace

size_t fp8_image_bytes(int64_t n_rows, int K) {
  return size_t(n_rows) * size_t((K + moe::kChunk - 1) / moe::kChunk) * 4 * kBlockB;
}

void fp8_image(const float* z, int64_t ldz, const __nv_bfloat16* h, int64_t n_rows, int K, uint8_t* img,
               float2* fx, cudaStream_t stream) {
  const int64_t n = n_rows * ((K + moe::kChunk - 1) / moe::kChunk) * 4;
  fp8_image_kernel<<<unsigned((n + 127) / 128), 128, 0, stream>>>(z, ldz, h, n_rows, K, img, fx);
  K3_CUDA_LAUNCH_CHECK();
}

void launch_decode_fp8(const GemmArgs& a, const uint8_t* img, const float2* fx, bool dual, unsigned max_tiles,
                       int T, int depth, cudaStream_t stream) {
  if (T == 4)
    depth == 3 ? launch_q<4, 3>(a, img, fx, dual, max_tiles, stream)
               : launch_q<4, 1>(a, img, fx, dual, max_tiles, stream);
  else if (T == 2)
    depth == 3 ? launch_q<2, 3>(a, img, fx, dual, max_tiles, stream)
               : launch_q<2, 1>(a, img, fx, dual, max_tiles, stream);
  else
    depth == 3 ? launch_q<1, 3>(a, img, fx, dual, max_tiles, stream)
               : launch_q<1, 1>(a, img, fx, dual, max_tiles, stream);
}

}  // namespace k3::moe_cuda
