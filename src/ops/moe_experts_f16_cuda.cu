// moe_experts_f16_cuda.cu: the routed experts' decode (n_tok <= kMoeDecodeMaxTok) on f16 MMAs, the scales on
// fp32 partial sums (moe_experts.h; the rules in moe_experts_layout.h, "the half-precision decode kernel").
//
// Why: the bf16 decode kernel (moe_experts_cuda.cu) spends ~4.5 instructions per nibble pair turning MXFP4
// into scaled bf16 (three integer operations, a shared shift, the scale multiply) and is issue-bound at
// ~0.5 of the copy rate. Here a nibble becomes an e4m3 byte by shifts and masks (moe::f8_even / f8_odd: 7
// operations per 8 weights) and a byte pair an f16 pair in one conversion: ~2.75 per pair, no multiply (the
// E8M0 scale is applied to fp32 partial sums). (An e4m3 MMA would take the bytes as they are, but
// mma.sync e4m3 on sm_90 is compiled to these same conversions plus an f16 MMA, on both operands.)
//
//   image   (f16_image_kernel, once per call and input): every row's groups of 32 activations as f16 times
//           a power of two, with the group's factor (moe::f16_pos order).
//   decode  (experts_decode_f16_kernel): tiles of <= T sorted rows of one expert (sort_kernel with BT = T);
//           a block of 4 warps owns (tile, 16 neurons gate + up / 32 down rows) and its warps split the
//           reduction into runs of 128-column chunks, as the bf16 kernel does. Lane (g, q) loads the 16 bytes
//           of its rows' group q of the chunk (32 columns, one E8M0 exponent); word i of them feeds two
//           m16n8k16 MMAs (h = 0, 1: a0 / a2 = the f16 pairs (4h, 4h + 2) / (4h + 1, 4h + 3) of row g, a1 / a3
//           of row g + 8). The 8 MMA columns are (group, token): column n sums group n / 2 of token n % 2
//           only, so lane (g, q) feeds B only where g / 2 == q (zeros elsewhere) and its accumulators
//           c0 .. c3 are rows g, g + 8 x tokens 0, 1 of its own group: it scales them by its own exponents and
//           the image factors into fp32 sums (tokens 2, 3: a second MMA). The tile's images are staged in
//           shared memory once per block. Rows of a lane's operands: gate / up A = w1 rows n0 + g, n0 + 8 + g,
//           B = w3 the same rows; down A = w2 rows n0 + g, n0 + 8 + g, B = n0 + 16 + g, n0 + 24 + g.
//   The gate / up kernel writes h in natural order; h's image is made before the down kernel.
// Numerics: weights and activations exact in f16 (activations 2^28 below their group's largest round), fp32
// products and sums in the MMA, a chunk's group sums scaled exactly (powers of two) and added in chunk order.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "ops/moe_experts_cuda.cuh"

namespace k3::moe_cuda {
namespace {

using namespace cuda_ops;

constexpr int kHWarps = 4;

__device__ __forceinline__ void mma_f16(float (&c)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                        uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// the four e4m3 bytes of b -> f16 pairs (bytes 0, 1) and (bytes 2, 3), exact
__device__ __forceinline__ void e4m3x4_f16x2(uint32_t b, uint32_t& lo, uint32_t& hi) {
  asm("{\n .reg .b16 l, h;\n mov.b32 {l, h}, %2;\n cvt.rn.f16x2.e4m3x2 %0, l;\n cvt.rn.f16x2.e4m3x2 %1, h;\n}\n"
      : "=r"(lo), "=r"(hi)
      : "r"(b));
}

// One group of 32 activations of row r: x = bf16(z) (z fp32, row stride ldz) or h (bf16, natural order, row
// length K) -> its f16 image (moe::f16_pos order) at dst and the factor f = 2^(E - 135) (E: the group's
// largest bf16 exponent field, >= 15), returned.
__device__ __forceinline__ float f16_group(const float* z, int64_t ldz, const __nv_bfloat16* h, int64_t r,
                                           int K, int grp, __half* dst) {
  float x[32];
  uint32_t E = 15;
#pragma unroll
  for (int c = 0; c < 32; ++c) {
    const __nv_bfloat16* hp = h + r * K + grp * 32 + c;
    x[c] = z ? round_bf16_dev(z[r * ldz + grp * 32 + c]) : __bfloat162float(*hp);
    E = max(E, (__float_as_uint(x[c]) >> 23) & 0xFFu);
  }
  const float s = __uint_as_float((268u - E) << 23);  // 2^(141 - E) <= 2^126
  __half v[32];
#pragma unroll
  for (int c = 0; c < 32; ++c) v[moe::f16_pos(c)] = __float2half_rn(x[c] * s);
#pragma unroll
  for (int u = 0; u < 4; ++u) reinterpret_cast<uint4*>(dst)[u] = reinterpret_cast<const uint4*>(v)[u];
  return __uint_as_float((E - 8u) << 23);  // 2^6 / s = 2^(E - 135) (the weights carry 2^-6)
}

// One thread per (row, group): the rows' images [n_rows][G][32] and factors [n_rows][G] (f16_group).
// Launched with PDL (run_decode_f16's chain): z's image runs beside the sort before it and waits for it at
// the end, so that its completion implies the sort's; h's image waits for the gate / up kernel first.
__global__ void f16_image_kernel(const float* z, int64_t ldz, const __nv_bfloat16* h, int64_t n_rows, int K,
                                 __half* img, float* fx) {
  pdl_launch_dependents();
  if (h) pdl_wait();
  const int G = K / 32;
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n_rows * G) fx[i] = f16_group(z, ldz, h, i / G, K, int(i % G), img + i * 32);
  if (z) pdl_wait();
}

struct HLoads {  // one lane's loads of one chunk: group q of its 4 rows (A g, A g + 8, B g, B g + 8)
  uint4 w[4];
  uint32_t ex[4];
};

// chunk c of a lane's 4 rows: w / sc point at the lane's group of chunk 0 (row base + q * 16 bytes / + q)
// (cstride: bytes from one chunk of a row to the next; 64 in the checkpoint's row-major layout)
__device__ __forceinline__ void h_load(HLoads& d, const uint8_t* const (&w)[4], const uint8_t* const (&sc)[4],
                                       const bool (&okr)[4], int c, bool ok, int cstride = 64) {
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    const bool on = ok && okr[k];
    d.w[k] = on ? __ldg(reinterpret_cast<const uint4*>(w[k] + c * cstride)) : make_uint4(0, 0, 0, 0);
    d.ex[k] = on ? __ldg(sc[k] + c * 4) : 127u;
  }
}

// One chunk c of a lane's loads d into its accumulators acc[set][operand A / B][c0 .. c3: rows g, g + 8 x
// tokens 2 s, 2 s + 1]. s_bx[s]: group q of chunk 0 of token 2 s + tok in the staged images; s_fx: the
// factors [T][G] of the same images; n_r: the tile's rows.
template <int NS>
__device__ __forceinline__ void h_chunk(float (&acc)[NS][2][4], const HLoads& d, int c, int q, bool feeds,
                                        int tok, int n_r, int G, const __half* const (&s_bx)[NS],
                                        const __half* s_zero, const float* s_fx) {
  const int grp = c * 4 + q;
  const bool okg = grp < G;
  const __half* bsrc[NS];  // this lane's B: its group of token 2 s + tok, or the zeros (chunk offset 0)
#pragma unroll
  for (int s = 0; s < NS; ++s) bsrc[s] = feeds && okg && 2 * s + tok < n_r ? s_bx[s] + c * 128 : s_zero;
  float cs[NS][2][4] = {};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    uint4 bx[NS];
#pragma unroll
    for (int s = 0; s < NS; ++s) bx[s] = *reinterpret_cast<const uint4*>(bsrc[s] + i * 8);
#pragma unroll
    for (int op = 0; op < 2; ++op) {
      const uint32_t w0 = (&d.w[2 * op].x)[i], w1 = (&d.w[2 * op + 1].x)[i];
      uint32_t a[2][4];  // [h]: the f16 pairs (4h, 4h + 2) of rows g, g + 8, then (4h + 1, 4h + 3)
      const uint32_t e0 = moe::f8_even(w0), e1 = moe::f8_even(w1), o0 = moe::f8_odd(w0), o1 = moe::f8_odd(w1);
      e4m3x4_f16x2(e0, a[0][0], a[1][0]), e4m3x4_f16x2(e1, a[0][1], a[1][1]);
      e4m3x4_f16x2(o0, a[0][2], a[1][2]), e4m3x4_f16x2(o1, a[0][3], a[1][3]);
#pragma unroll
      for (int h = 0; h < 2; ++h)
#pragma unroll
        for (int s = 0; s < NS; ++s) {
          if (s > 0 && 2 * s >= n_r) break;  // warp-uniform (set 0 always runs: n_r >= 1)
          mma_f16(cs[s][op], a[h][0], a[h][1], a[h][2], a[h][3], h ? bx[s].z : bx[s].x,
                  h ? bx[s].w : bx[s].y);
        }
    }
  }
  float ws[4];
#pragma unroll
  for (int k = 0; k < 4; ++k) ws[k] = __uint_as_float(moe::e8m0_f32_bits(d.ex[k]));
#pragma unroll
  for (int s = 0; s < NS; ++s) {
    if (s > 0 && 2 * s >= n_r) break;
    const float f0 = okg && 2 * s < n_r ? s_fx[(2 * s) * G + grp] : 0.f;
    const float f1 = okg && 2 * s + 1 < n_r ? s_fx[(2 * s + 1) * G + grp] : 0.f;
#pragma unroll
    for (int op = 0; op < 2; ++op)
#pragma unroll
      for (int k = 0; k < 4; ++k)  // k: row g + (k / 2) * 8, token 2 s + k % 2
        acc[s][op][k] = fmaf(cs[s][op][k], (k & 1 ? f1 : f0) * ws[2 * op + (k >> 1)], acc[s][op][k]);
  }
}

// The block's sums: the 4 lanes of a row hold its 4 groups' sums (added here, every lane gets the total);
// warps 1.. write theirs to part, which warp 0 adds after the caller's barrier (h_store).
template <int NS>
__device__ __forceinline__ void h_reduce(float (&acc)[NS][2][4], int warp, int lane,
                                         float (*part)[32][NS * 8]) {
  float(&flat)[NS * 8] = reinterpret_cast<float(&)[NS * 8]>(acc);  // acc[s][op][k] at (s * 2 + op) * 4 + k
#pragma unroll
  for (int i = 0; i < NS * 8; ++i) {
    flat[i] += __shfl_xor_sync(0xffffffffu, flat[i], 1);
    flat[i] += __shfl_xor_sync(0xffffffffu, flat[i], 2);
  }
  if (warp > 0) {
#pragma unroll
    for (int i = 0; i < NS * 8; ++i) part[warp - 1][lane][i] = flat[i];
  }
}

// warp 0, lane (g, q < n_r): token q's totals of the block's rows -> out (dec_store_token)
template <bool DUAL, int NS>
__device__ __forceinline__ void h_store(const GemmArgs& a, const float (&acc)[NS][2][4], int lane, int g,
                                        int q, int r0, int n0, const float (*part)[32][NS * 8]) {
  float v[4] = {0.f, 0.f, 0.f, 0.f};  // dec_store_token's order
#pragma unroll
  for (int s = 0; s < NS; ++s)
#pragma unroll
    for (int op = 0; op < 2; ++op)
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        if (2 * s + (k & 1) != q) continue;
        float x = acc[s][op][k];
#pragma unroll
        for (int w = 0; w < kHWarps - 1; ++w) x += part[w][lane][(s * 2 + op) * 4 + k];
        v[DUAL ? 2 * (k >> 1) + op : 2 * op + (k >> 1)] = x;  // DUAL: (gate, up) a neuron; else rows g + 8 o
      }
  dec_store_token<DUAL>(a, r0, q, n0, g, v);
}

// shared memory: the tile's images [T][G][32] f16, 32 zeros, factors [T][G], the warps' partial sums
template <int T>
size_t h_smem_bytes(int K) {
  const int G = K / 32;
  return size_t(T) * G * 64 + size_t(T) * G * 4 + 64 + size_t(kHWarps - 1) * 32 * 4 * T * 4;
}

// T: rows per tile (2 or 4: lane q of a row writes token q); DEPTH: chunks of weight loads in flight per
// warp. PDL (launched with programmatic serialization, run_decode_f16's chain): gate / up waits for the
// kernels before it first; down reads its tile (the sort finished before gate / up began) and issues its
// first weight loads before it waits for h's image, so they overlap the gate / up kernel's last blocks. Both
// let the next kernel launch once they have waited.
template <bool DUAL, int T, int DEPTH, int MINB, bool PDL = false>
__global__ void __launch_bounds__(kHWarps * 32, MINB)
    experts_decode_f16_kernel(GemmArgs a, const __half* img, const float* fx) {
  static_assert(T == 2 || T == 4, "an MMA's columns are (4 groups x 2 tokens)");
  constexpr int NS = T / 2;  // MMA column sets (tokens 2 s, 2 s + 1)
  extern __shared__ uint4 h_smem[];
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, g = lane >> 2, q = lane & 3;
  if constexpr (PDL && DUAL) pdl_wait(), pdl_launch_dependents();
  const int4 ti = a.tiles[blockIdx.x];  // (expert, first sorted row, rows <= T)
  if (ti.x < 0) return;
  const int r0 = ti.y, n_r = ti.z, K = a.K, G = K / 32;
  __half* s_img = reinterpret_cast<__half*>(h_smem);                  // [T][G][32]
  __half* s_zero = s_img + size_t(T) * G * 32;                          // [32] zeros: B of the other lanes
  float* s_fx = reinterpret_cast<float*>(s_zero + 32);                  // [T][G]
  float(*part)[32][4 * T] = reinterpret_cast<float(*)[32][4 * T]>(s_fx + T * G);
  const MoeExpertPtrs ep = a.experts[ti.x];
  constexpr int kNeur = DUAL ? 16 : 32;
  const int n0 = blockIdx.y * kNeur;
  const uint8_t* const wp[4] = {DUAL ? ep.w1 : ep.w2, DUAL ? ep.w1 : ep.w2, DUAL ? ep.w3 : ep.w2,
                                DUAL ? ep.w3 : ep.w2};
  const uint8_t* const sp[4] = {DUAL ? ep.s1 : ep.s2, DUAL ? ep.s1 : ep.s2, DUAL ? ep.s3 : ep.s2,
                                DUAL ? ep.s3 : ep.s2};
  const int row[4] = {n0 + g, n0 + 8 + g, DUAL ? n0 + g : n0 + 16 + g, DUAL ? n0 + 8 + g : n0 + 24 + g};
  const int n_chunk = (K + moe::kChunk - 1) / moe::kChunk, per = (n_chunk + kHWarps - 1) / kHWarps;
  const int c_begin = warp * per, c_end = min(n_chunk, c_begin + per);
  const uint8_t* wr[4];
  const uint8_t* sr[4];
  bool okr[4];
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    okr[k] = row[k] < a.n_out;
    wr[k] = wp[k] + (okr[k] ? size_t(row[k]) * (K / 2) + q * 16 : 0);
    sr[k] = sp[k] + (okr[k] ? size_t(row[k]) * (K / 32) + q : 0);
  }
#if K3_MOE_F16_CONTIG
  // Probe build (wrong results, timings only): the bytes of the block's rows read as if each chunk's rows lay
  // contiguously (chunk c of the kNeur-row group at c x rows x 64, the rows in order): the access pattern of
  // a layout re-made at load time, over the same bytes.
  constexpr int kRows = DUAL ? 16 : 32, cstride = kRows * 64;
#pragma unroll
  for (int k = 0; k < 4; ++k)
    wr[k] = wp[k] + (okr[k] ? size_t(n0) * (K / 2) + (row[k] - n0) * 64 + q * 16 : 0);
#else
  constexpr int cstride = 64;
#endif
  HLoads buf[DEPTH + 1];
  auto load = [&](int c, HLoads& d) {
    h_load(d, wr, sr, okr, c, c < c_end && c * moe::kChunk + q * 32 < K, cstride);
  };
#pragma unroll
  for (int i = 0; i < DEPTH; ++i) load(c_begin + i, buf[i]);  // in flight while the images are staged
  if constexpr (PDL && !DUAL) pdl_wait(), pdl_launch_dependents();
  for (int t = 0; t < n_r; ++t) {
    const int64_t ir = DUAL ? a.order[r0 + t] / a.k : r0 + t;  // image row: token (gate / up), sorted row
    for (int u = tid; u < G * 4; u += kHWarps * 32)
      cp_async16(s_img + (size_t(t) * G * 4 + u) * 8, img + (ir * G * 4 + u) * 8, true);
    for (int i = tid; i < G; i += kHWarps * 32) s_fx[t * G + i] = fx[ir * G + i];
  }
  if (tid < 4) reinterpret_cast<uint4*>(s_zero)[tid] = make_uint4(0, 0, 0, 0);
  cp_async_commit();
  cp_async_wait_all();
  __syncthreads();
  const int tok = g & 1;                // this lane's B column g is (group g / 2, token tok of each set)
  const bool feeds = (g >> 1) == q;
  const __half* s_bx[NS];               // group q of chunk 0 of token 2 s + tok (f16 units of 8)
#pragma unroll
  for (int s = 0; s < NS; ++s) s_bx[s] = s_img + (size_t(2 * s + tok) * G + q) * 32;
  float acc[NS][2][4] = {};             // [set][operand A / B][c0 .. c3: rows g, g + 8 x tokens 2 s, 2 s + 1]
  for (int c = c_begin; c < c_end; c += DEPTH + 1) {
#pragma unroll
    for (int j = 0; j <= DEPTH; ++j) {
      load(c + j + DEPTH, buf[(j + DEPTH) % (DEPTH + 1)]);  // past c_end: predicated off
      if (c + j >= c_end) break;                            // warp-uniform
      h_chunk<NS>(acc, buf[j], c + j, q, feeds, tok, n_r, G, s_bx, s_zero, s_fx);
    }
  }
  h_reduce<NS>(acc, warp, lane, part);
  __syncthreads();
  if (warp == 0 && q < n_r) h_store<DUAL, NS>(a, acc, lane, g, q, r0, n0, part);
}

template <int T, int DEPTH, int MINB, bool PDL = false>
void launch_h(const GemmArgs& a, const __half* img, const float* fx, bool dual, unsigned max_tiles,
              cudaStream_t stream) {
  auto k = dual ? experts_decode_f16_kernel<true, T, DEPTH, MINB, PDL>
                : experts_decode_f16_kernel<false, T, DEPTH, MINB, PDL>;
  const size_t smem = h_smem_bytes<T>(a.K);
  if (smem > 48 * 1024)  // K > 5024 at T = 4
    K3_CUDA_ASSERT(cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
  const int n_neur = dual ? 16 : 32;
  const dim3 grid(max_tiles, unsigned((a.n_out + n_neur - 1) / n_neur));
  launch_pdl(PDL, k, grid, dim3(kHWarps * 32), smem, stream, a, img, fx);
  K3_CUDA_LAUNCH_CHECK();
}

}  // namespace

void f16_image(const float* z, int64_t ldz, const __nv_bfloat16* h, int64_t n_rows, int K, __half* img,
               float* fx, cudaStream_t stream, bool pdl) {
  const int64_t n = n_rows * (K / 32);
  launch_pdl(pdl, f16_image_kernel, dim3(unsigned((n + 127) / 128)), dim3(128), 0, stream, z, ldz, h, n_rows,
             K, img, fx);
  K3_CUDA_LAUNCH_CHECK();
}

void launch_decode_f16(const GemmArgs& a, const __half* img, const float* fx, bool dual, unsigned max_tiles,
                       int T, int depth, cudaStream_t stream, bool minb4, bool pdl) {
  if (pdl && T == 2 && depth == 2)  // (the PDL chain: the default's shape only)
    minb4 ? launch_h<2, 2, 4, true>(a, img, fx, dual, max_tiles, stream)
          : launch_h<2, 2, 3, true>(a, img, fx, dual, max_tiles, stream);
  else if (minb4 && T == 2 && depth == 2)  // 128 registers: 4 blocks (16 warps) an SM
    launch_h<2, 2, 4>(a, img, fx, dual, max_tiles, stream);
  else if (T == 4)
    depth == 2 ? launch_h<4, 2, 3>(a, img, fx, dual, max_tiles, stream)
               : launch_h<4, 1, 4>(a, img, fx, dual, max_tiles, stream);
  else if (depth == 3)
    launch_h<2, 3, 3>(a, img, fx, dual, max_tiles, stream);
  else
    depth == 2 ? launch_h<2, 2, 3>(a, img, fx, dual, max_tiles, stream)
               : launch_h<2, 1, 4>(a, img, fx, dual, max_tiles, stream);
}

}  // namespace k3::moe_cuda
