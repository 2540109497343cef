// moe_experts_cuda.cu: the routed MXFP4 experts on the GPU (moe_experts.h), prefill and decode.
//
// One kernel shape serves both: C^T = W X^T per expert with the weights as the MMA's A operand.
//   rows (t, j) of the layer are counting-sorted by expert on the device (one block; offsets, the sorted
//   row list and, per expert, the start of its BT-row tiles); a block of 8 warps takes one (expert, BT-row
//   tile, neuron tile); each warp owns 16 neurons (gate + up for the same 16) or 32 (down).
//   A lane loads 16 bytes = 32 MXFP4 weights = one scale group of its weight row straight into registers
//   and decodes them to bf16 pairs (byte -> bf16x2 table in shared memory, times the E8M0 scale: exact);
//   these are its A fragments for 8 k16 steps, the k index permuted within the 128-column chunk the warp's
//   4 lanes of a row cover. The activations X (BT rows of bf16) are staged per 128-column chunk in shared
//   memory in the same permuted order (cp.async, double buffered), so a B fragment is one 16-byte load.
//   mma.sync m16n8k16 bf16 -> fp32. No weight tile in shared memory, so no decode is repeated per warp.
//   BT = 64 for prefill, 8 for decode (batch <= kMoeDecodeMaxTok: the same code, a warp per 16 neurons
//   streaming its rows, many blocks in flight; the MMA's unused token columns cost nothing there).
// gate/up epilogue: h = bf16(act(bf16(g), bf16(u))) -> H [sorted row, d_ff] bf16.
// down epilogue: o = bf16(w2 h) -> O [t * k + j, d_in] bf16.  combine: y = bf16(sum_j wt_j o_j).
#include <cuda_bf16.h>

#include <algorithm>
#include <atomic>

#include "core/env.h"
#include "ops/moe_experts_cuda.cuh"

namespace k3 {

namespace {

using namespace cuda_ops;
using namespace moe_cuda;

using moe::kChunk;
constexpr int kWarps = 8;
constexpr int kSortThreads = 1024;
constexpr int kXUnits = kChunk / 8 + 4;  // 16-byte units per staged X row (+4 padding: conflict-free loads)

size_t align256(size_t n) { return (n + 255) / 256 * 256; }

struct Scratch {  // carved from p.scratch
  __nv_bfloat16* zb;   // [n_tok, d_in]
  int* offsets;        // [n_expert + 1] first sorted row of each expert
  int* tile_start;     // [n_expert + 1] first tile of each expert (tiles of BT rows)
  int* order;          // [n_rows] sorted position -> row t * k + j
  int4* tiles;         // [decode_tiles] decode tiles: (expert or -1, first sorted row, rows, 0)
  __nv_bfloat16* h;    // [n_rows, d_ff] sorted rows
  __nv_bfloat16* o;    // [n_rows, d_in] rows t * k + j
  // decode only (n_tok <= kMoeDecodeMaxTok): the f16 path's images (its z image is zb's bytes)
  float* fz;      // [n_tok, d_in / 32]
  __half* img_h;  // [n_rows, d_ff]
  float* fh;      // [n_rows, d_ff / 32]
  size_t bytes;
};

// the most tiles of BT rows n_rows rows of E experts make (a tiled kernel's grid x)
int64_t decode_tiles(int64_t n_rows, int E, int BT = moe::kDecodeTile) {
  return (n_rows + BT - 1) / BT + std::min<int64_t>(E, n_rows);
}

Scratch carve(const MoeExpertsParams& p, void* base) {
  const int64_t n_rows = p.n_tok * p.k;
  char* b = static_cast<char*>(base);
  Scratch s{};
  size_t off = 0;
  auto take = [&](size_t n) {
    char* q = b ? b + off : nullptr;
    off += align256(n);
    return q;
  };
  s.zb = reinterpret_cast<__nv_bfloat16*>(take(size_t(p.n_tok) * p.d_in * 2));
  s.offsets = reinterpret_cast<int*>(take(size_t(p.n_expert + 1) * 4));
  s.tile_start = reinterpret_cast<int*>(take(size_t(p.n_expert + 1) * 4));
  s.order = reinterpret_cast<int*>(take(size_t(n_rows) * 4));
  s.tiles = reinterpret_cast<int4*>(take(size_t(decode_tiles(n_rows, p.n_expert, 1)) * 16));
  s.h = reinterpret_cast<__nv_bfloat16*>(take(size_t(n_rows) * p.d_ff * 2));
  s.o = reinterpret_cast<__nv_bfloat16*>(take(size_t(n_rows) * p.d_in * 2));
  if (p.n_tok <= kMoeDecodeMaxTok) {
    s.fz = reinterpret_cast<float*>(take(size_t(p.n_tok) * (p.d_in / 32) * 4));
    s.img_h = reinterpret_cast<__half*>(take(size_t(n_rows) * p.d_ff * 2));
    s.fh = reinterpret_cast<float*>(take(size_t(n_rows) * (p.d_ff / 32) * 4));
  }
  s.bytes = off;
  return s;
}

enum class XOrder : int { natural, unit, wg };

// zb = bf16(z); unit: each 8-column unit stored in the decode kernel's order (moe::unit_pos); wg: each
// 128-column chunk in the wgmma prefill kernel's order (moe::wg_pos)
__global__ void to_bf16_kernel(const float* z, int64_t ldz, int64_t n_tok, int d, XOrder order,
                               __nv_bfloat16* zb) {
  const int64_t e = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (e >= n_tok * d) return;
  const int64_t dst = order == XOrder::unit ? (e & ~int64_t(7)) | moe::unit_pos(int(e & 7))
                      : order == XOrder::wg ? (e & ~int64_t(127)) | moe::wg_pos(int(e & 127))
                                            : e;
  zb[dst] = __float2bfloat16_rn(z[(e / d) * ldz + e % d]);
}

// Counting sort of the n_rows = n_tok * k rows by expert, one block. Out-of-range ids count as expert 0
// (the router never makes them; this only keeps every access in bounds). tiles (decode): each of the n_tiles
// tiles' (expert, first sorted row, rows), expert -1 past the last tile, so a block finds its tile in one
// load.
__global__ void __launch_bounds__(kSortThreads)
    sort_kernel(const int32_t* sel, int n_rows, int E, int BT, int* offsets, int* tile_start, int* order,
                int4* tiles = nullptr, int n_tiles = 0) {
  pdl_launch_dependents();  // (the f16 decode's PDL chain: z's image runs beside the sort)
  extern __shared__ int sm[];
  int* cnt = sm;       // [E]
  int* fill = sm + E;  // [E]
  __shared__ int carry[2], warp_sums[2][32];
  for (int e = threadIdx.x; e < E; e += blockDim.x) cnt[e] = 0;
  __syncthreads();
  for (int r = threadIdx.x; r < n_rows; r += blockDim.x) {
    int e = sel[r];
    atomicAdd(&cnt[(e >= 0 && e < E) ? e : 0], 1);
  }
  if (threadIdx.x == 0) carry[0] = carry[1] = 0;
  __syncthreads();
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  for (int e0 = 0; e0 < E; e0 += blockDim.x) {  // exclusive scans of the counts and of the tile counts
    const int e = e0 + threadIdx.x;
    const int c = e < E ? cnt[e] : 0;
    int v[2] = {c, (c + BT - 1) / BT};
    int incl[2];
    for (int q = 0; q < 2; ++q) {
      int x = v[q];
      for (int o = 1; o < 32; o <<= 1) {
        const int y = __shfl_up_sync(0xffffffffu, x, o);
        if (lane >= o) x += y;
      }
      incl[q] = x;
      if (lane == 31) warp_sums[q][warp] = x;
    }
    __syncthreads();
    if (warp == 0) {
      for (int q = 0; q < 2; ++q) {
        int x = lane < int(blockDim.x / 32) ? warp_sums[q][lane] : 0;
        for (int o = 1; o < 32; o <<= 1) {
          const int y = __shfl_up_sync(0xffffffffu, x, o);
          if (lane >= o) x += y;
        }
        warp_sums[q][lane] = x - (lane < int(blockDim.x / 32) ? warp_sums[q][lane] : 0);  // exclusive
      }
    }
    __syncthreads();
    if (e < E) {
      const int off = carry[0] + warp_sums[0][warp] + incl[0] - v[0];
      offsets[e] = off, fill[e] = off;
      tile_start[e] = carry[1] + warp_sums[1][warp] + incl[1] - v[1];
    }
    __syncthreads();
    if (threadIdx.x == blockDim.x - 1) carry[0] += warp_sums[0][warp] + incl[0], carry[1] += warp_sums[1][warp] + incl[1];
    __syncthreads();
  }
  if (threadIdx.x == 0) offsets[E] = carry[0], tile_start[E] = carry[1];
  __syncthreads();
  if (tiles) {
    for (int e = threadIdx.x; e < E; e += blockDim.x)
      for (int t = tile_start[e], r0 = offsets[e]; t < tile_start[e + 1]; ++t, r0 += BT)
        tiles[t] = make_int4(e, r0, min(BT, offsets[e + 1] - r0), 0);
    for (int t = tile_start[E] + threadIdx.x; t < n_tiles; t += blockDim.x) tiles[t] = make_int4(-1, 0, 0, 0);
  }
  for (int r = threadIdx.x; r < n_rows; r += blockDim.x) {
    int e = sel[r];
    e = (e >= 0 && e < E) ? e : 0;
    order[atomicAdd(&fill[e], 1)] = r;
  }
}

// y[t, i] = bf16(sum_j wt[t, j] o[t * k + j, i]), slot order (waits for the down kernel where launched
// with PDL)
__global__ void combine_kernel(const __nv_bfloat16* o, const float* wt, int64_t n_tok, int k, int d, float* y,
                               int64_t ldy) {
  pdl_wait();
  const int64_t e = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (e >= n_tok * d) return;
  const int64_t t = e / d, i = e % d;
  float acc = 0.f;
  for (int j = 0; j < k; ++j) acc += wt[t * k + j] * __bfloat162float(o[(t * k + j) * d + i]);
  y[t * ldy + i] = round_bf16_dev(acc);
}

// y = bf16(sum_j wt_j o_j) of the call (combine_kernel over every token)
void combine(const MoeExpertsParams& p, const Scratch& s, GpuContext& g, bool pdl = false) {
  launch_pdl(pdl, combine_kernel, dim3(unsigned((p.n_tok * p.d_in + 255) / 256)), dim3(256), 0, g.stream, s.o,
             p.wt, p.n_tok, p.k, p.d_in, p.y, p.ldy ? p.ldy : p.d_in);
  K3_CUDA_LAUNCH_CHECK();
}

// One weight operand of a warp: 16 rows x 128 columns of the chunk; lane (g = lane / 4, q = lane % 4) holds
// columns [q * 32, q * 32 + 32) of rows g and g + 8 (raw) and their scales.
struct WRaw {
  uint4 r0, r1;
  uint32_t s0, s1;  // bf16x2 scale 2^(e - 127) in both halves
};

__device__ __forceinline__ void load_w(WRaw& w, const uint8_t* wp, const uint8_t* sp, int K, int n_out, int row0,
                                       int col, bool col_ok) {
  const int lane = threadIdx.x & 31, g = lane >> 2;
  const int ra = row0 + g, rb = row0 + g + 8;
  const bool oa = col_ok && ra < n_out, ob = col_ok && rb < n_out;
  w.r0 = oa ? __ldg(reinterpret_cast<const uint4*>(wp + size_t(ra) * (K / 2) + col / 2)) : make_uint4(0, 0, 0, 0);
  w.r1 = ob ? __ldg(reinterpret_cast<const uint4*>(wp + size_t(rb) * (K / 2) + col / 2)) : make_uint4(0, 0, 0, 0);
  w.s0 = moe::e8m0_bf16x2(oa ? __ldg(sp + size_t(ra) * (K / 32) + col / 32) : 127);
  w.s1 = moe::e8m0_bf16x2(ob ? __ldg(sp + size_t(rb) * (K / 32) + col / 32) : 127);
}

// A fragment of k16 step s (0..7): bytes 2s, 2s+1 of rows g (a0, a2) and g + 8 (a1, a3).
// REP: the table is replicated per lane (entry b of lane l at b * 32 + l: every lookup conflict-free).
template <bool REP>
__device__ __forceinline__ uint32_t lut_at(const uint32_t* lut, uint32_t b) {
  if constexpr (REP) return lut[(b << 5) | (threadIdx.x & 31)];
  return lut[b];
}
template <bool REP>
__device__ __forceinline__ void frag_a(const WRaw& w, int s, const uint32_t* lut, uint32_t* a) {
  const uint32_t* r0 = &w.r0.x;
  const uint32_t* r1 = &w.r1.x;
  a[0] = bf16x2_mul(lut_at<REP>(lut, moe::a_byte(r0, s, 0)), w.s0);
  a[2] = bf16x2_mul(lut_at<REP>(lut, moe::a_byte(r0, s, 1)), w.s0);
  a[1] = bf16x2_mul(lut_at<REP>(lut, moe::a_byte(r1, s, 0)), w.s1);
  a[3] = bf16x2_mul(lut_at<REP>(lut, moe::a_byte(r1, s, 1)), w.s1);
}

template <bool DUAL, int BT, bool REP>
__global__ void __launch_bounds__(kWarps * 32, BT <= 8 ? 3 : 1) experts_gemm_kernel(GemmArgs a) {
  constexpr int NF = BT / 8;  // token fragments
  extern __shared__ uint4 dyn_smem[];
  uint4(*xs)[BT * kXUnits] = reinterpret_cast<uint4(*)[BT * kXUnits]>(dyn_smem);  // [2][BT * kXUnits]
  uint32_t* lut = reinterpret_cast<uint32_t*>(dyn_smem + 2 * BT * kXUnits);      // [REP ? 256 * 32 : 256]
  __shared__ int src_row[BT];
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  // byte (2 e2m1, low nibble first) -> bf16x2; REP: entry b of lane l at b * 32 + l (conflict-free writes too)
  for (int i = tid; i < (REP ? 256 * 32 : 256); i += kWarps * 32) lut[i] = moe::e2m1x2_bf16x2(REP ? i >> 5 : i);
  // which expert and which rows
  const int tile = blockIdx.x;
  if (tile >= a.tile_start[a.E]) return;
  const int e = moe::tile_expert(a.tile_start, a.E, tile);
  const int r0 = a.offsets[e] + (tile - a.tile_start[e]) * BT;
  const int n_r = min(BT, a.offsets[e + 1] - r0);
  if (tid < BT) {
    int src = -1;
    if (tid < n_r) src = DUAL ? a.order[r0 + tid] / a.k : r0 + tid;
    src_row[tid] = src;
  }
  const MoeExpertPtrs ep = a.experts[e];
  constexpr int kNeur = DUAL ? 16 : 32;  // neurons per warp
  const int n0 = (blockIdx.y * kWarps + warp) * kNeur;
  const uint8_t* wA = DUAL ? ep.w1 : ep.w2;
  const uint8_t* sA = DUAL ? ep.s1 : ep.s2;
  const uint8_t* wB = DUAL ? ep.w3 : ep.w2;
  const uint8_t* sB = DUAL ? ep.s3 : ep.s2;
  const int rowA = n0, rowB = DUAL ? n0 : n0 + 16;
  __syncthreads();

  auto stage = [&](int buf, int c0) {  // X rows, chunk [c0, c0 + 128), permuted 16-byte units
    for (int i = tid; i < n_r * 16; i += kWarps * 32) {  // rows past n_r only feed token columns never stored
      const int r = i >> 4, u = i & 15;                    // u = q * 4 + s'
      const int col = c0 + u * 8;
      const int src = src_row[r];
      const bool ok = col < a.K;
      const __nv_bfloat16* gp = a.x + (ok ? size_t(src) * a.K + col : 0);
      cp_async16(&xs[buf][r * kXUnits + moe::x_slot(u)], gp, ok);
    }
    cp_async_commit();
  };

  float accA[NF][4], accB[NF][4];
#pragma unroll
  for (int f = 0; f < NF; ++f)
#pragma unroll
    for (int i = 0; i < 4; ++i) accA[f][i] = accB[f][i] = 0.f;

  const int q = lane & 3, n_l = lane >> 2;
  const int n_chunk = (a.K + kChunk - 1) / kChunk;
  stage(0, 0);
  WRaw wa, wb;
  {
    const int col = q * 32;
    load_w(wa, wA, sA, a.K, a.n_out, rowA, col, col < a.K);
    load_w(wb, wB, sB, a.K, a.n_out, rowB, col, col < a.K);
  }
  for (int c = 0; c < n_chunk; ++c) {
    const int buf = c & 1;
    cp_async_wait_all();
    __syncthreads();
    if (c + 1 < n_chunk) stage(buf ^ 1, (c + 1) * kChunk);
    WRaw na, nb;  // next chunk's weights, in flight during this chunk's MMAs
    const int ncol = (c + 1) * kChunk + q * 32;
    const bool nok = c + 1 < n_chunk && ncol < a.K;
    load_w(na, wA, sA, a.K, a.n_out, rowA, ncol, nok);
    load_w(nb, wB, sB, a.K, a.n_out, rowB, ncol, nok);
#pragma unroll
    for (int sp = 0; sp < 4; ++sp) {  // pairs of k16 steps: one 16-byte X unit per token fragment
      uint32_t fa0[4], fa1[4], fb0[4], fb1[4];
      frag_a<REP>(wa, 2 * sp, lut, fa0);
      frag_a<REP>(wa, 2 * sp + 1, lut, fa1);
      frag_a<REP>(wb, 2 * sp, lut, fb0);
      frag_a<REP>(wb, 2 * sp + 1, lut, fb1);
#pragma unroll
      for (int f = 0; f < NF; ++f) {
        if (f * 8 >= n_r) break;  // block-uniform: a partial tile runs only its 8-row fragments
        const uint4 xv = xs[buf][(f * 8 + n_l) * kXUnits + moe::b_slot(sp, q)];
        mma_bf16(accA[f], fa0, xv.x, xv.y);
        mma_bf16(accA[f], fa1, xv.z, xv.w);
        mma_bf16(accB[f], fb0, xv.x, xv.y);
        mma_bf16(accB[f], fb1, xv.z, xv.w);
      }
    }
    wa = na, wb = nb;
  }
  // epilogue: accumulator (neuron row g / g + 8, token columns 2q, 2q + 1)
  const int g = lane >> 2;
#pragma unroll
  for (int f = 0; f < NF; ++f)
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int tok = f * 8 + 2 * q + (i & 1);
      const int nr = g + (i >> 1) * 8;
      if (tok >= n_r) continue;
      if constexpr (DUAL) {
        const int neuron = n0 + nr;
        if (neuron >= a.n_out) continue;
        const float gv = round_bf16_dev(accA[f][i]), uv = round_bf16_dev(accB[f][i]);
        a.out[size_t(r0 + tok) * a.n_out + neuron] = __float2bfloat16_rn(act_dev(a.act, gv, uv, a.beta1, a.beta2));
      } else {
        const size_t orow = size_t(a.order[r0 + tok]) * a.n_out;
        if (n0 + nr < a.n_out) a.out[orow + n0 + nr] = __float2bfloat16_rn(accA[f][i]);
        if (n0 + 16 + nr < a.n_out) a.out[orow + n0 + 16 + nr] = __float2bfloat16_rn(accB[f][i]);
      }
    }
}

// ---- decode: experts_decode_kernel ----
// For n_tok <= kMoeDecodeMaxTok (batch-1 decode reads every weight once for one or a few tokens: a byte
// stream). Block = kDecWarps warps on one (tile of 8 sorted rows, group of 16 neurons (gate + up) or 32 rows
// (down)); the warps split the reduction into runs of whole 128-column chunks, so a neuron group's bytes
// stream through 4 warps at once, and add their partial accumulators in shared memory at the end. A lane
// keeps the next chunk's weight and activation loads in flight while it decodes the current one. No
// shared-memory table: weights become bf16 by shifts and masks (moe::e2m1_pair) times 2^(e - 1); activations
// come from global memory (L1/L2: every block of a tile reads the same rows) in the unit order
// (moe::unit_pos), so a 16-byte load holds the B registers of two k16 steps. MMA k16 step s (0..7) of lane
// (g, q) in a chunk: word s / 2 of its 16 weight bytes (columns q * 32 + 8 (s / 2) ..), nibble pairs
// 2 (s % 2) (a0 / a1) and 2 (s % 2) + 1 (a2 / a3).
constexpr int kDecWarps = 4;

__device__ __forceinline__ uint4 ldg16(const void* p, bool ok) {
  return ok ? __ldg(reinterpret_cast<const uint4*>(p)) : make_uint4(0, 0, 0, 0);
}

// row `row` of W ([n_out, K] MXFP4), the group of column `col` (this lane's 32 columns): raw bytes, exponent
__device__ __forceinline__ void load_group(uint4& raw, uint32_t& ex, const uint8_t* w, const uint8_t* sc,
                                           int K, int n_out, int row, int col, bool col_ok) {
  const bool ok = col_ok && row < n_out;
  raw = ldg16(w + size_t(row) * (K / 2) + col / 2, ok);
  ex = ok ? __ldg(sc + size_t(row) * (K / 32) + col / 32) : 127u;
}

// acc += W[rows] x over one chunk; BIG: some exponent of the chunk exceeds kPairScaleMax (two multiplies)
template <bool BIG>
__device__ __forceinline__ void chunk_mma(const uint4& a0, const uint4& a1, uint32_t ea0, uint32_t ea1,
                                          const uint4 (&x)[4], float* acc) {
  uint32_t s0, t0, s1, t1;
  pair_scales(ea0, s0, t0), pair_scales(ea1, s1, t1);
  const uint32_t* w0 = &a0.x;
  const uint32_t* w1 = &a1.x;
#pragma unroll
  for (int wi = 0; wi < 4; ++wi) {
    uint32_t f[2][4];
    dec_frags<BIG>(w0[wi], w1[wi], s0, s1, t0, t1, f);
    mma_bf16(acc, f[0], x[wi].x, x[wi].y);
    mma_bf16(acc, f[1], x[wi].z, x[wi].w);
  }
}

// What a decode block works on: its tile's rows, its neuron group, this warp's run of chunks.
struct DecTile {
  int r0, n_r;                       // first sorted row of the tile, rows in it (<= 8)
  int n0, rowA, rowB;                // first neuron of the group; this lane's rows g of operands A and B
  int c_begin, c_end;                // this warp's chunks
  const __nv_bfloat16* xrow;         // token column g's X row (unit order), nullptr past n_r
  const uint8_t *wA, *sA, *wB, *sB;  // operand A = gate (DUAL) / down rows n0.., B = up / down rows n0 + 16..
};

template <bool DUAL>
__device__ __forceinline__ bool dec_tile(const GemmArgs& a, DecTile& t) {
  constexpr int kNeur = DUAL ? 16 : 32;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2;
  const int4 ti = a.tiles[blockIdx.x];  // (expert, first sorted row, rows): one load, no search
  if (ti.x < 0) return false;
  const int e = ti.x;
  t.r0 = ti.y, t.n_r = ti.z;
  t.xrow = g < t.n_r ? a.x + size_t(DUAL ? a.order[t.r0 + g] / a.k : t.r0 + g) * a.K : nullptr;
  const MoeExpertPtrs ep = a.experts[e];
  t.n0 = blockIdx.y * kNeur;
  t.wA = DUAL ? ep.w1 : ep.w2, t.sA = DUAL ? ep.s1 : ep.s2;
  t.wB = DUAL ? ep.w3 : ep.w2, t.sB = DUAL ? ep.s3 : ep.s2;
  t.rowA = t.n0 + g, t.rowB = (DUAL ? t.n0 : t.n0 + 16) + g;
  const int n_chunk = (a.K + moe::kChunk - 1) / moe::kChunk, per = (n_chunk + kDecWarps - 1) / kDecWarps;
  t.c_begin = warp * per, t.c_end = min(n_chunk, t.c_begin + per);
  return true;
}

// The tile's outputs from warp 0's complete sums: DUAL h = act(g, u) in unit order (the down GEMM's X), else
// o rows at their (t, j) slots. Accumulator i: neuron row g + (i / 2) * 8, token column 2 q + i % 2.
template <bool DUAL>
__device__ __forceinline__ void dec_write(const GemmArgs& a, int r0, int n_r, int n0, const float (&accA)[4],
                                          const float (&accB)[4]) {
  const int lane = threadIdx.x & 31, g = lane >> 2, q = lane & 3;
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const int tok = 2 * q + (i & 1), nr = g + (i >> 1) * 8;
    if (tok >= n_r) continue;
    if constexpr (DUAL) {
      const int neuron = n0 + nr;
      if (neuron >= a.n_out) continue;
      const float gv = round_bf16_dev(accA[i]), uv = round_bf16_dev(accB[i]);
      const int pos = (neuron & ~7) | moe::unit_pos(neuron & 7);
      a.out[size_t(r0 + tok) * a.n_out + pos] = __float2bfloat16_rn(act_dev(a.act, gv, uv, a.beta1, a.beta2));
    } else {
      const size_t orow = size_t(a.order[r0 + tok]) * a.n_out;
      if (n0 + nr < a.n_out) a.out[orow + n0 + nr] = __float2bfloat16_rn(accA[i]);
      if (n0 + 16 + nr < a.n_out) a.out[orow + n0 + 16 + nr] = __float2bfloat16_rn(accB[i]);
    }
  }
}

// Warps 1.. leave their partial accumulators in `part`, `sync` makes them visible, warp 0 adds them in warp
// order. Returns true in warp 0 (which then holds the sums).
template <class Sync>
__device__ __forceinline__ bool dec_reduce(float (&accA)[4], float (&accB)[4], float (*part)[32][8], Sync sync) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  if (warp > 0) {
#pragma unroll
    for (int i = 0; i < 4; ++i) part[warp - 1][lane][i] = accA[i], part[warp - 1][lane][4 + i] = accB[i];
  }
  sync();
  if (warp > 0) return false;
#pragma unroll
  for (int w = 0; w < kDecWarps - 1; ++w)
#pragma unroll
    for (int i = 0; i < 4; ++i) accA[i] += part[w][lane][i], accB[i] += part[w][lane][4 + i];
  return true;
}

// Adds the warps' partial accumulators (in warp order) and writes the tile's outputs (dec_write).
template <bool DUAL>
__device__ __forceinline__ void dec_finish(const GemmArgs& a, const DecTile& t, float (&accA)[4],
                                           float (&accB)[4], float (*part)[32][8]) {
  if (dec_reduce(accA, accB, part, [] { __syncthreads(); })) dec_write<DUAL>(a, t.r0, t.n_r, t.n0, accA, accB);
}

// both operands of one chunk into the accumulators (one or two multiplies per weight pair)
__device__ __forceinline__ void chunk_both(const uint4& a0, const uint4& a1, const uint4& b0, const uint4& b1,
                                           const uint32_t (&ex)[4], const uint4 (&x)[4], float (&accA)[4],
                                           float (&accB)[4]) {
  const bool big = __any_sync(0xffffffffu, max(max(ex[0], ex[1]), max(ex[2], ex[3])) > moe::kPairScaleMax);
  if (!big) {
    chunk_mma<false>(a0, a1, ex[0], ex[1], x, accA);
    chunk_mma<false>(b0, b1, ex[2], ex[3], x, accB);
  } else {
    chunk_mma<true>(a0, a1, ex[0], ex[1], x, accA);
    chunk_mma<true>(b0, b1, ex[2], ex[3], x, accB);
  }
}

struct DecLoads {        // one lane's loads of one chunk
  uint4 a0, a1, b0, b1;  // raw MXFP4 of rows g, g + 8 of operand A, then of B (its 32-column group)
  uint32_t ex[4];        // their E8M0 exponents
  uint4 x[4];            // token column g's activations, columns q * 32 .. + 32 (unit order)
};

// Register version: DEPTH chunks' loads in flight per warp (DecLoads ring); MINB: blocks per SM the registers
// are sized for.
template <bool DUAL, int DEPTH, int MINB>
__global__ void __launch_bounds__(kDecWarps * 32, MINB) experts_decode_kernel(GemmArgs a) {
  __shared__ float part[kDecWarps - 1][32][8];
  DecTile t;
  if (!dec_tile<DUAL>(a, t)) return;
  const int q = threadIdx.x & 3;
  DecLoads buf[DEPTH + 1];
  auto load = [&](int c, DecLoads& d) {
    const int col = c * moe::kChunk + q * 32;
    const bool ok = c < t.c_end && col < a.K;
    load_group(d.a0, d.ex[0], t.wA, t.sA, a.K, a.n_out, t.rowA, col, ok);
    load_group(d.a1, d.ex[1], t.wA, t.sA, a.K, a.n_out, t.rowA + 8, col, ok);
    load_group(d.b0, d.ex[2], t.wB, t.sB, a.K, a.n_out, t.rowB, col, ok);
    load_group(d.b1, d.ex[3], t.wB, t.sB, a.K, a.n_out, t.rowB + 8, col, ok);
#pragma unroll
    for (int wi = 0; wi < 4; ++wi) d.x[wi] = ldg16(t.xrow + (ok ? col + wi * 8 : 0), ok && t.xrow != nullptr);
  };
  float accA[4] = {0.f, 0.f, 0.f, 0.f}, accB[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
  for (int i = 0; i < DEPTH; ++i) load(t.c_begin + i, buf[i]);
  for (int c = t.c_begin; c < t.c_end; c += DEPTH + 1) {
#pragma unroll
    for (int j = 0; j <= DEPTH; ++j) {
      load(c + j + DEPTH, buf[(j + DEPTH) % (DEPTH + 1)]);  // past c_end: predicated off
      if (c + j >= t.c_end) break;                          // warp-uniform
      const DecLoads& d = buf[j];
      chunk_both(d.a0, d.a1, d.b0, d.b1, d.ex, d.x, accA, accB);
    }
  }
  dec_finish<DUAL>(a, t, accA, accB, part);
}

template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

// Shared-memory version: each warp keeps R chunks in a ring of its own in shared memory (R - 1 in flight,
// filled by cp.async: no registers held by loads in flight); a lane reads back only what it copied itself,
// so no barrier. Slot (stage, k) of a lane: k = 0..3 the raw weights of rows g, g + 8 of A, then B; 4..7 its
// X units. Exponents stay in registers (R x 4, loaded R - 1 chunks ahead).
template <int R>
constexpr size_t dec_ring_bytes() {
  return size_t(kDecWarps) * R * 8 * 32 * 16;
}

template <bool DUAL, int R, int MINB>
__global__ void __launch_bounds__(kDecWarps * 32, MINB) experts_decode_ring_kernel(GemmArgs a) {
  extern __shared__ uint4 ring[];  // [kDecWarps][R][8][32]
  __shared__ float part[kDecWarps - 1][32][8];
  DecTile t;
  if (!dec_tile<DUAL>(a, t)) return;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, q = lane & 3;
  uint4* my = ring + size_t(warp) * R * 8 * 32 + lane;  // slot (stage, k) at my[(stage * 8 + k) * 32]
  uint32_t ex[R][4];
  auto issue = [&](int c, int st) {
    const int col = c * moe::kChunk + q * 32;
    const bool ok = c < t.c_end && col < a.K;
    const uint8_t* w[4] = {t.wA, t.wA, t.wB, t.wB};
    const uint8_t* sc[4] = {t.sA, t.sA, t.sB, t.sB};
    const int row[4] = {t.rowA, t.rowA + 8, t.rowB, t.rowB + 8};
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      const bool okr = ok && row[k] < a.n_out;
      cp_async16(my + (st * 8 + k) * 32, w[k] + (okr ? size_t(row[k]) * (a.K / 2) + col / 2 : 0), okr);
      ex[st][k] = okr ? __ldg(sc[k] + size_t(row[k]) * (a.K / 32) + col / 32) : 127u;
    }
    const bool okx = ok && t.xrow != nullptr;
#pragma unroll
    for (int wi = 0; wi < 4; ++wi)
      cp_async16(my + (st * 8 + 4 + wi) * 32, okx ? t.xrow + col + wi * 8 : a.x, okx);
    cp_async_commit();
  };
  float accA[4] = {0.f, 0.f, 0.f, 0.f}, accB[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
  for (int i = 0; i < R - 1; ++i) issue(t.c_begin + i, i);
  for (int c = t.c_begin; c < t.c_end; c += R) {
#pragma unroll
    for (int j = 0; j < R; ++j) {
      issue(c + j + R - 1, (j + R - 1) % R);  // past c_end: zero-filled, no memory traffic
      if (c + j >= t.c_end) break;            // warp-uniform
      cp_async_wait<R - 1>();                 // chunk c + j has landed
      const uint4* sl = my + j * 8 * 32;
      const uint4 x[4] = {sl[4 * 32], sl[5 * 32], sl[6 * 32], sl[7 * 32]};
      chunk_both(sl[0], sl[32], sl[2 * 32], sl[3 * 32], ex[j], x, accA, accB);
    }
  }
  cp_async_wait<0>();
  dec_finish<DUAL>(a, t, accA, accB, part);
}

#ifdef K3_MOE_VARIANTS  // bench builds only, until it has run on a GPU
// ---- decode, bulk-copy version: experts_decode_bulk_kernel (bench variants 17-19) ----
// Persistent: CTAS CTAs per SM walk the items (valid tile t, neuron group y), item i = t * groups + y,
// CTA b taking b, b + gridDim.x, ..., so no CTA waits on a tile lookup, a pointer load and a first weight load
// before it streams (experts_decode_kernel's blocks each do, ~6 waves of them per call at n_tok = 1). Per CTA:
// a producer warp copies each item's 32 weight rows (16 gate + 16 up, or 32 down) and their scales in stages
// of kBulkCols columns, one cp.async.bulk per row and lane, into a ring of RING stages (mbarriers full /
// empty per stage); 4 consumer warps take one 128-column chunk of each stage each (warp w: chunk w), decode
// and multiply them as experts_decode_kernel does (chunk_both), keep their accumulators over the item's
// stages and add them in shared memory at its end (dec_reduce, partials double-buffered by item parity, one
// named barrier of the 4 consumer warps per item). Needs K % kBulkCols == 0 (so n_out % 32 == 0 here too)
// and 16-byte aligned expert matrices (arena allocations are 256-byte aligned): bulk_ok().
// Measured (H100, session 11): correct (fp64 checks), but slower than experts_decode_kernel: b = 1 214-257 us
// against 179, b = 64 6.3-8.0 ms against 5.3, fewer consumer warps being slower; so the default kernel is
// bound by its decode instructions, not by its loads in flight or its blocks' start. Kept as a bench variant.
constexpr int kBulkCols = 512;                    // columns per stage: one chunk per consumer warp
constexpr int kBulkRows = 32;                     // rows per item
constexpr int kBulkPitch = kBulkCols / 2 + 64;    // bytes per staged row; +64: rows g, g + 1 in other banks
constexpr int kBulkScaleOff = kBulkRows * kBulkPitch;                     // then [kBulkRows][16] scales
constexpr int kBulkStage = kBulkScaleOff + kBulkRows * (kBulkCols / 32);  // 10752 bytes
constexpr int kBulkThreads = (kDecWarps + 1) * 32;  // + the producer warp
static_assert(kBulkCols == kDecWarps * moe::kChunk, "one chunk per consumer warp and stage");

template <int RING>
struct BulkBars {
  uint64_t full[RING], empty[RING];
  float part[2][kDecWarps - 1][32][8];
};

__device__ __forceinline__ unsigned smem_u32(const void* p) {
  return static_cast<unsigned>(__cvta_generic_to_shared(p));
}

__device__ __forceinline__ void mbar_init(uint64_t* bar, unsigned count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(smem_u32(bar)), "r"(count) : "memory");
}
__device__ __forceinline__ void mbar_arrive(uint64_t* bar) {
  asm volatile("mbarrier.arrive.release.cta.shared::cta.b64 _, [%0];" ::"r"(smem_u32(bar)) : "memory");
}
__device__ __forceinline__ void mbar_arrive_tx(uint64_t* bar, unsigned bytes) {
  asm volatile("mbarrier.arrive.expect_tx.release.cta.shared::cta.b64 _, [%0], %1;" ::"r"(smem_u32(bar)),
               "r"(bytes)
               : "memory");
}
__device__ __forceinline__ void mbar_wait(uint64_t* bar, unsigned parity) {
  unsigned done = 0;
  while (!done)
    asm volatile(
        "{\n\t.reg .pred p;\n\tmbarrier.try_wait.parity.acquire.cta.shared::cta.b64 p, [%1], %2;\n\t"
        "selp.u32 %0, 1, 0, p;\n\t}"
        : "=r"(done)
        : "r"(smem_u32(bar)), "r"(parity)
        : "memory");
}
__device__ __forceinline__ void bulk_g2s(void* dst, const void* src, unsigned bytes, uint64_t* bar) {
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(
          smem_u32(dst)),
      "l"(src), "r"(bytes), "r"(smem_u32(bar))
      : "memory");
}

// RING stages per CTA, CTAS CTAs per SM (the default: 4 and 4, 49 KB of shared memory per CTA)
template <bool DUAL, int RING, int CTAS>
__global__ void __launch_bounds__(kBulkThreads, CTAS) experts_decode_bulk_kernel(GemmArgs a) {
  extern __shared__ __align__(128) unsigned char stage_mem[];  // [RING][kBulkStage]
  __shared__ BulkBars<RING> sb;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, g = lane >> 2, q = lane & 3;
  if (tid == 0) {
    for (int i = 0; i < RING; ++i) mbar_init(&sb.full[i], 1), mbar_init(&sb.empty[i], kDecWarps);
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  __syncthreads();
  constexpr int kNeur = DUAL ? 16 : 32;
  const int groups = a.n_out / kNeur, n_st = a.K / kBulkCols;
  const int n_items = a.tile_start[a.E] * groups;  // the valid tiles come first (sort_kernel)
  if (warp == kDecWarps) {  // producer: lane r copies staged row r (DUAL: gate rows 0..15, up rows 16..31)
    int k = 0;
    for (int it = blockIdx.x; it < n_items; it += gridDim.x) {
      const int t = it / groups, n0 = (it - t * groups) * kNeur;
      const MoeExpertPtrs ep = a.experts[a.tiles[t].x];
      const bool up = DUAL && lane >= 16;
      const uint8_t* w = DUAL ? (up ? ep.w3 : ep.w1) : ep.w2;
      const uint8_t* sc = DUAL ? (up ? ep.s3 : ep.s1) : ep.s2;
      const size_t row = size_t(n0 + (DUAL ? (lane & 15) : lane));
      const uint8_t* wrow = w + row * (a.K / 2);
      const uint8_t* srow = sc + row * (a.K / 32);
      for (int st = 0; st < n_st; ++st, ++k) {
        const int slot = k % RING;
        mbar_wait(&sb.empty[slot], ((k / RING) & 1) ^ 1);  // the first pass finds every slot free
        if (lane == 0) mbar_arrive_tx(&sb.full[slot], kBulkRows * (kBulkCols / 2 + kBulkCols / 32));
        __syncwarp();
        unsigned char* dst = stage_mem + size_t(slot) * kBulkStage;
        bulk_g2s(dst + lane * kBulkPitch, wrow + st * (kBulkCols / 2), kBulkCols / 2, &sb.full[slot]);
        bulk_g2s(dst + kBulkScaleOff + lane * (kBulkCols / 32), srow + st * (kBulkCols / 32), kBulkCols / 32,
                 &sb.full[slot]);
      }
    }
    return;
  }
  // consumers: staged rows g, g + 8 (operand A), 16 + g, 24 + g (operand B)
  int k = 0, parity = 0;
  for (int it = blockIdx.x; it < n_items; it += gridDim.x, parity ^= 1) {
    const int t = it / groups, n0 = (it - t * groups) * kNeur;
    const int4 ti = a.tiles[t];  // (expert, first sorted row, rows)
    const int r0 = ti.y, n_r = ti.z;
    const __nv_bfloat16* xrow =
        g < n_r ? a.x + size_t(DUAL ? a.order[r0 + g] / a.k : r0 + g) * a.K : nullptr;
    float accA[4] = {0.f, 0.f, 0.f, 0.f}, accB[4] = {0.f, 0.f, 0.f, 0.f};
    auto load_x = [&](int st, uint4(&x)[4]) {  // this warp's chunk of stage st: columns q * 32 .. + 32
      const int col = (st * kDecWarps + warp) * moe::kChunk + q * 32;
      const bool ok = xrow != nullptr && st < n_st;
#pragma unroll
      for (int wi = 0; wi < 4; ++wi) x[wi] = ldg16(xrow + (ok ? col + wi * 8 : 0), ok);
    };
    uint4 xn[4];
    load_x(0, xn);
    for (int st = 0; st < n_st; ++st, ++k) {
      const uint4 x[4] = {xn[0], xn[1], xn[2], xn[3]};
      load_x(st + 1, xn);  // the next stage's activations in flight while this one is decoded
      const int slot = k % RING;
      mbar_wait(&sb.full[slot], (k / RING) & 1);
      const unsigned char* src = stage_mem + size_t(slot) * kBulkStage;
      const int off = warp * (moe::kChunk / 2) + q * 16;
      const uint4 a0 = *reinterpret_cast<const uint4*>(src + g * kBulkPitch + off);
      const uint4 a1 = *reinterpret_cast<const uint4*>(src + (g + 8) * kBulkPitch + off);
      const uint4 b0 = *reinterpret_cast<const uint4*>(src + (g + 16) * kBulkPitch + off);
      const uint4 b1 = *reinterpret_cast<const uint4*>(src + (g + 24) * kBulkPitch + off);
      const unsigned char* se = src + kBulkScaleOff + warp * 4 + q;
      const uint32_t ex[4] = {se[g * 16], se[(g + 8) * 16], se[(g + 16) * 16], se[(g + 24) * 16]};
      __syncwarp();
      if (lane == 0) mbar_arrive(&sb.empty[slot]);  // release: this warp's reads of the slot are done
      chunk_both(a0, a1, b0, b1, ex, x, accA, accB);
    }
    if (dec_reduce(accA, accB, sb.part[parity],
                   [] { asm volatile("bar.sync 1, %0;" ::"n"(kDecWarps * 32) : "memory"); }))
      dec_write<DUAL>(a, r0, n_r, n0, accA, accB);
  }
}

bool bulk_ok(const MoeExpertsParams& p) {
  return p.n_tok <= kMoeDecodeMaxTok && p.d_in % kBulkCols == 0 && p.d_ff % kBulkCols == 0;
}

template <bool DUAL, int RING, int CTAS>
void launch_decode_bulk(const GemmArgs& a, unsigned max_tiles, GpuContext& g) {
  static std::atomic<bool> sized[64] = {};
  smem_opt_in(sized, RING * kBulkStage, experts_decode_bulk_kernel<true, RING, CTAS>,
              experts_decode_bulk_kernel<false, RING, CTAS>);
  const int64_t items = int64_t(max_tiles) * (a.n_out / (DUAL ? 16 : 32));
  const unsigned grid = unsigned(std::min<int64_t>(items, int64_t(device_sm_count()) * CTAS));
  experts_decode_bulk_kernel<DUAL, RING, CTAS><<<grid, kBulkThreads, RING * kBulkStage, g.stream>>>(a);
  K3_CUDA_LAUNCH_CHECK();
}

// ---- decode, table version: experts_decode_lut_kernel (bench variants 12-16; n_tok <= 2) ----
// The work split of experts_decode_kernel (block = (tile, 16 neurons gate + up / 32 down rows), 4 warps
// splitting the reduction, DEPTH chunks of loads in flight per warp), with the decode of
// moe_experts_layout.h's table version: a byte -> bf16x2 table in shared memory, one copy per lane (one prmt
// + one conflict-free load per weight byte), and the E8M0 scale applied to fp32 per-group partial sums (MMA
// column n = (group n / 2, token n % 2)) instead of to every pair. Rows of a lane's operands: gate / up
// (DUAL) A = (w1, w3) rows n0 + g (MMA rows g, g + 8), B = the same for n0 + 8 + g; down A = w2 rows n0 + g,
// n0 + 8 + g, B = n0 + 16 + g, n0 + 24 + g. Activations stay in natural column order (z and h), staged once
// per block in the table's gaps.
constexpr int kLutSmem = moe::kLutBytes + (kDecWarps - 1) * 32 * 8 * 4;

struct LutLoads {  // one lane's loads of one chunk: its 32-column group of 4 rows (see above), exponents
  uint4 w[4];
  uint32_t ex[4];
};

__device__ __forceinline__ uint32_t lut_get(const char* lut, uint32_t w, int k, uint32_t lane) {
  return *reinterpret_cast<const uint32_t*>(lut + moe::lut_addr(w, k, lane));
}

// the chunk's 8 k16 steps (byte 2 s / 2 s + 1 of the group: a0 / a2 of rows g, a1 / a3 of rows g + 8) into
// fresh accumulators, then acc += 2^(e - 127) * partial (fp32, exact scaling) per row
__device__ __forceinline__ void lut_chunk(const LutLoads& d, const uint4 (&x)[4], const char* lut,
                                          uint32_t lane, float (&accA)[4], float (&accB)[4]) {
  float ca[4] = {0.f, 0.f, 0.f, 0.f}, cb[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
  for (int wi = 0; wi < 4; ++wi) {
    const uint32_t wa0 = (&d.w[0].x)[wi], wa1 = (&d.w[1].x)[wi], wb0 = (&d.w[2].x)[wi], wb1 = (&d.w[3].x)[wi];
    const uint32_t xb[4] = {x[wi].x, x[wi].y, x[wi].z, x[wi].w};
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const uint32_t fa[4] = {lut_get(lut, wa0, 2 * h, lane), lut_get(lut, wa1, 2 * h, lane),
                              lut_get(lut, wa0, 2 * h + 1, lane), lut_get(lut, wa1, 2 * h + 1, lane)};
      const uint32_t fb[4] = {lut_get(lut, wb0, 2 * h, lane), lut_get(lut, wb1, 2 * h, lane),
                              lut_get(lut, wb0, 2 * h + 1, lane), lut_get(lut, wb1, 2 * h + 1, lane)};
      mma_bf16(ca, fa, xb[2 * h], xb[2 * h + 1]);
      mma_bf16(cb, fb, xb[2 * h], xb[2 * h + 1]);
    }
  }
  float sc[4];
#pragma unroll
  for (int k = 0; k < 4; ++k) sc[k] = __uint_as_float(moe::e8m0_f32_bits(d.ex[k]));
#pragma unroll
  for (int i = 0; i < 4; ++i) {  // accumulator i: row g + (i / 2) * 8, column 2 q + i % 2
    accA[i] = fmaf(ca[i], sc[i >> 1], accA[i]);
    accB[i] = fmaf(cb[i], sc[2 + (i >> 1)], accB[i]);
  }
}

// PDL (down only): launched with programmatic stream serialization, its blocks look up their tile, put their
// first weight loads in flight and fill the table while the gate / up kernel finishes, and wait for it
// (griddepcontrol.wait) only before staging h. The gate / up kernel lets it start at once.
template <bool DUAL, int DEPTH, int MINB, bool PDL = false>
__global__ void __launch_bounds__(kDecWarps * 32, MINB) experts_decode_lut_kernel(GemmArgs a) {
  extern __shared__ uint4 lut_smem[];  // [kLutBytes] table + staged activations, then the partial sums
  char* lut = reinterpret_cast<char*>(lut_smem);
  float(*part)[32][8] = reinterpret_cast<float(*)[32][8]>(lut + moe::kLutBytes);
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, g = lane >> 2, q = lane & 3;
  if constexpr (DUAL) pdl_launch_dependents();  // a no-op unless the next kernel is launched with PDL
  const int4 ti = a.tiles[blockIdx.x];          // (expert, first sorted row, rows <= kLutTok)
  if (ti.x < 0) return;
  const int r0 = ti.y, n_r = ti.z, K = a.K;
  const MoeExpertPtrs ep = a.experts[ti.x];
  constexpr int kNeur = DUAL ? 16 : 32;
  const int n0 = blockIdx.y * kNeur;
  const uint8_t* wp[4] = {DUAL ? ep.w1 : ep.w2, DUAL ? ep.w3 : ep.w2, DUAL ? ep.w1 : ep.w2,
                          DUAL ? ep.w3 : ep.w2};
  const uint8_t* sp[4] = {DUAL ? ep.s1 : ep.s2, DUAL ? ep.s3 : ep.s2, DUAL ? ep.s1 : ep.s2,
                          DUAL ? ep.s3 : ep.s2};
  const int row[4] = {n0 + g, DUAL ? n0 + g : n0 + 8 + g, DUAL ? n0 + 8 + g : n0 + 16 + g,
                      DUAL ? n0 + 8 + g : n0 + 24 + g};
  const int n_chunk = (K + moe::kChunk - 1) / moe::kChunk, per = (n_chunk + kDecWarps - 1) / kDecWarps;
  const int c_begin = warp * per, c_end = min(n_chunk, c_begin + per);
  LutLoads buf[DEPTH + 1];
  auto load = [&](int c, LutLoads& d) {
    const int col = c * moe::kChunk + q * 32;
    const bool ok = c < c_end && col < K;
#pragma unroll
    for (int k = 0; k < 4; ++k) load_group(d.w[k], d.ex[k], wp[k], sp[k], K, a.n_out, row[k], col, ok);
  };
#pragma unroll
  for (int i = 0; i < DEPTH; ++i) load(c_begin + i, buf[i]);  // in flight while the block sets up
  {  // the table (one copy per lane), then the tile's activation rows into its gaps (cp.async)
    static_assert(kDecWarps * 32 == 128, "table fill: 16 low nibbles x 8 16-byte pieces");
    const int j = tid & 7, lo = tid >> 3;
    const uint32_t flo = moe::e2m1x2_bf16x2(uint32_t(lo)) & 0xffffu;
#pragma unroll
    for (int hi = 0; hi < 16; ++hi) {
      const uint32_t v = flo | (moe::e2m1x2_bf16x2(uint32_t(hi)) << 16);
      *reinterpret_cast<uint4*>(lut + (hi * 16 + lo) * 256 + j * 16) = make_uint4(v, v, v, v);
    }
    if constexpr (PDL) pdl_wait();  // h is the gate / up kernel's output
    static_assert(moe::kLutTok == 2, "two activation rows");
    const __nv_bfloat16* x0 = a.x + size_t(DUAL ? a.order[r0] / a.k : r0) * K;
    const __nv_bfloat16* x1 = n_r > 1 ? a.x + size_t(DUAL ? a.order[r0 + 1] / a.k : r0 + 1) * K : x0;
    const int units = K / 8;  // 16-byte units of a row
    for (int i = tid; i < n_r * units; i += kDecWarps * 32) {
      const int t = i >= units, u = i - t * units;
      cp_async16(lut + moe::lut_x_off(t, u >> 2) + (u & 3) * 16, (t ? x1 : x0) + u * 8, true);
    }
    cp_async_commit();
    cp_async_wait_all();
    __syncthreads();
  }
  // B operand: lane (g, q) feeds token g % 2 where g / 2 == q, zeros elsewhere
  const int tok = g & 1;
  const bool own = (g >> 1) == q && tok < n_r;
  float accA[4] = {0.f, 0.f, 0.f, 0.f}, accB[4] = {0.f, 0.f, 0.f, 0.f};
  for (int c = c_begin; c < c_end; c += DEPTH + 1) {
#pragma unroll
    for (int j = 0; j <= DEPTH; ++j) {
      load(c + j + DEPTH, buf[(j + DEPTH) % (DEPTH + 1)]);  // past c_end: predicated off
      if (c + j >= c_end) break;                            // warp-uniform
      const int G = (c + j) * 4 + q;
      uint4 x[4];
      const bool okx = own && G * 32 < K;
#pragma unroll
      for (int wi = 0; wi < 4; ++wi)
        x[wi] = okx ? *reinterpret_cast<const uint4*>(lut + moe::lut_x_off(tok, G) + wi * 16)
                    : make_uint4(0, 0, 0, 0);
      lut_chunk(buf[j], x, lut, uint32_t(lane), accA, accB);
    }
  }
  // the 4 lanes of a row hold its 4 groups' sums: add them (all 4 lanes get the total), then the warps'
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    accA[i] += __shfl_xor_sync(0xffffffffu, accA[i], 1), accB[i] += __shfl_xor_sync(0xffffffffu, accB[i], 1);
    accA[i] += __shfl_xor_sync(0xffffffffu, accA[i], 2), accB[i] += __shfl_xor_sync(0xffffffffu, accB[i], 2);
  }
  if (warp > 0) {
#pragma unroll
    for (int i = 0; i < 4; ++i) part[warp - 1][lane][i] = accA[i], part[warp - 1][lane][4 + i] = accB[i];
  }
  __syncthreads();
  if (warp > 0 || q >= n_r) return;  // lane q < n_r of a row stores token q
#pragma unroll
  for (int w = 0; w < kDecWarps - 1; ++w)
#pragma unroll
    for (int i = 0; i < 4; ++i) accA[i] += part[w][lane][i], accB[i] += part[w][lane][4 + i];
  const float v[4] = {q ? accA[1] : accA[0], q ? accA[3] : accA[2], q ? accB[1] : accB[0],
                      q ? accB[3] : accB[2]};
  dec_store_token<DUAL>(a, r0, q, n0, g, v);  // DUAL: v = gate, up of n0 + g, then of n0 + 8 + g
}

template <int DEPTH, int MINB, bool PDL>
void launch_decode_lut(const GemmArgs& a, unsigned max_tiles, int n_neur_blocks, bool dual, GpuContext& g) {
  auto k = dual ? experts_decode_lut_kernel<true, DEPTH, MINB>
                : experts_decode_lut_kernel<false, DEPTH, MINB, PDL>;
  static std::atomic<bool> sized[64] = {};
  smem_opt_in(sized, kLutSmem, experts_decode_lut_kernel<true, DEPTH, MINB>,
              experts_decode_lut_kernel<false, DEPTH, MINB, PDL>);
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3(max_tiles, unsigned(n_neur_blocks)), cfg.blockDim = dim3(kDecWarps * 32);
  cfg.dynamicSmemBytes = kLutSmem, cfg.stream = g.stream;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = attr, cfg.numAttrs = PDL && !dual && g.stream ? 1 : 0;  // (not on the legacy default stream)
  K3_CUDA_ASSERT(cudaLaunchKernelEx(&cfg, k, a));
}

// the table version applies when every tile has <= 2 rows and both reduction lengths fit the gaps
bool decode_lut_ok(const MoeExpertsParams& p) {
  return p.n_tok <= moe::kLutTok && p.d_in <= moe::kLutMaxK && p.d_ff <= moe::kLutMaxK;
}
#endif  // K3_MOE_VARIANTS

// RING > 0: the shared-memory version with RING stages; else the register version with DEPTH chunks in flight
template <int RING, int DEPTH, int MINB>
void launch_decode(const GemmArgs& a, unsigned max_tiles, int n_neur_blocks, bool dual, GpuContext& g) {
  const dim3 grid(max_tiles, unsigned(n_neur_blocks));
  if constexpr (RING > 0) {
    auto k =
        dual ? experts_decode_ring_kernel<true, RING, MINB> : experts_decode_ring_kernel<false, RING, MINB>;
    static std::atomic<bool> sized[64] = {};
    smem_opt_in(sized, int(dec_ring_bytes<RING>()), experts_decode_ring_kernel<true, RING, MINB>,
                experts_decode_ring_kernel<false, RING, MINB>);
    k<<<grid, kDecWarps * 32, dec_ring_bytes<RING>(), g.stream>>>(a);
  } else {
    auto k = dual ? experts_decode_kernel<true, DEPTH, MINB> : experts_decode_kernel<false, DEPTH, MINB>;
    k<<<grid, kDecWarps * 32, 0, g.stream>>>(a);
  }
  K3_CUDA_LAUNCH_CHECK();
}

// LUT: the table version (decode_lut_ok(p); activations in natural order), PDL: its down kernel with PDL;
// BULK: the bulk-copy version (bulk_ok(p)) with RING stages and MINB CTAs per SM (DEPTH unused)
template <int RING, int DEPTH, int MINB, bool LUT = false, bool PDL = false, bool BULK = false>
void run_decode(const MoeExpertsParams& p, const Scratch& s, int64_t n_rows, GpuContext& g) {
  constexpr int BT = moe::kDecodeTile;
  const unsigned max_tiles = unsigned(decode_tiles(n_rows, p.n_expert));
  sort_kernel<<<1, kSortThreads, size_t(2) * p.n_expert * 4, g.stream>>>(
      p.sel, int(n_rows), p.n_expert, BT, s.offsets, s.tile_start, s.order, s.tiles, int(max_tiles));
  K3_CUDA_LAUNCH_CHECK();
  GemmArgs a{p.experts, s.tiles, s.offsets, s.tile_start, s.order, p.n_expert, p.k,
             p.d_ff,    p.d_in,  s.zb,      s.h,          p.act,   p.beta1,    p.beta2};
#ifdef K3_MOE_VARIANTS
  if constexpr (LUT) {
    launch_decode_lut<DEPTH, MINB, PDL>(a, max_tiles, (p.d_ff + 15) / 16, true, g);
    a.n_out = p.d_in, a.K = p.d_ff, a.x = s.h, a.out = s.o;
    launch_decode_lut<DEPTH, MINB, PDL>(a, max_tiles, (p.d_in + 31) / 32, false, g);
    return;
  }
  if constexpr (BULK) {
    launch_decode_bulk<true, RING, MINB>(a, max_tiles, g);
    a.n_out = p.d_in, a.K = p.d_ff, a.x = s.h, a.out = s.o;
    launch_decode_bulk<false, RING, MINB>(a, max_tiles, g);
    return;
  }
#endif
  launch_decode<RING, DEPTH, MINB>(a, max_tiles, (p.d_ff + 15) / 16, true, g);
  a.n_out = p.d_in, a.K = p.d_ff, a.x = s.h, a.out = s.o;
  launch_decode<RING, DEPTH, MINB>(a, max_tiles, (p.d_in + 31) / 32, false, g);
}

// The half-precision decode path (moe_experts_f16_cuda.cu): tiles of T rows; the z image in zb's bytes.
// pdl (T = 2, depth 2): every launch after the sort with programmatic serialization: z's image beside the
// sort, each kernel's blocks resident before the one before it ends, the down kernel's first weight loads
// under the gate / up kernel's tail (the waits: f16_image_kernel, experts_decode_f16_kernel, combine_kernel).
void run_decode_f16(const MoeExpertsParams& p, const Scratch& s, int64_t n_rows, GpuContext& g, int T,
                    int depth, bool minb4 = false, bool pdl = false) {
  pdl = pdl && T == 2 && depth == 2;
  const unsigned max_tiles = unsigned(decode_tiles(n_rows, p.n_expert, T));
  __half* img_z = reinterpret_cast<__half*>(s.zb);
  sort_kernel<<<1, kSortThreads, size_t(2) * p.n_expert * 4, g.stream>>>(
      p.sel, int(n_rows), p.n_expert, T, s.offsets, s.tile_start, s.order, s.tiles, int(max_tiles));
  K3_CUDA_LAUNCH_CHECK();
  f16_image(p.z, p.ldz ? p.ldz : p.d_in, nullptr, p.n_tok, p.d_in, img_z, s.fz, g.stream, pdl);
  GemmArgs a{p.experts, s.tiles, s.offsets, s.tile_start, s.order, p.n_expert, p.k,
             p.d_ff,    p.d_in,  nullptr,   s.h,          p.act,   p.beta1,    p.beta2};
  launch_decode_f16(a, img_z, s.fz, true, max_tiles, T, depth, g.stream, minb4, pdl);
  f16_image(nullptr, 0, s.h, n_rows, p.d_ff, s.img_h, s.fh, g.stream, pdl);
  a.n_out = p.d_in, a.K = p.d_ff, a.out = s.o;
  launch_decode_f16(a, s.img_h, s.fh, false, max_tiles, T, depth, g.stream, minb4, pdl);
  combine(p, s, g, pdl);
}

template <bool DUAL, int BT, bool REP>
void launch_gemm(const GemmArgs& a, int64_t n_rows, GpuContext& g) {
  const int64_t max_tiles = decode_tiles(n_rows, a.E, BT);
  const int per_block = kWarps * (DUAL ? 16 : 32);
  const dim3 grid(unsigned(max_tiles), unsigned((a.n_out + per_block - 1) / per_block));
  const size_t smem = size_t(2 * BT * kXUnits) * 16 + (REP ? 256 * 32 : 256) * 4;
  if (smem > 48 * 1024)  // only the bench variants (the default BT 8 / 64 tiles stay below)
    K3_CUDA_ASSERT(cudaFuncSetAttribute(experts_gemm_kernel<DUAL, BT, REP>,
                                        cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
  experts_gemm_kernel<DUAL, BT, REP><<<grid, kWarps * 32, smem, g.stream>>>(a);
  K3_CUDA_LAUNCH_CHECK();
}

template <int BT, bool REP = false>
void run_path(const MoeExpertsParams& p, const Scratch& s, int64_t n_rows, GpuContext& g) {
  sort_kernel<<<1, kSortThreads, size_t(2) * p.n_expert * 4, g.stream>>>(p.sel, int(n_rows), p.n_expert, BT,
                                                                          s.offsets, s.tile_start, s.order);
  K3_CUDA_LAUNCH_CHECK();
  GemmArgs a{p.experts, nullptr, s.offsets, s.tile_start, s.order, p.n_expert, p.k,
             p.d_ff,    p.d_in,  s.zb,      s.h,          p.act,   p.beta1,    p.beta2};
  launch_gemm<true, BT, REP>(a, n_rows, g);
  a.n_out = p.d_in, a.K = p.d_ff, a.x = s.h, a.out = s.o;
  launch_gemm<false, BT, REP>(a, n_rows, g);
}

// the wgmma prefill path (moe::wg_ok): tiles of <= kWgTile rows, activations and h in the wg order
void run_wg(const MoeExpertsParams& p, const Scratch& s, int64_t n_rows, GpuContext& g) {
  sort_kernel<<<1, kSortThreads, size_t(2) * p.n_expert * 4, g.stream>>>(p.sel, int(n_rows), p.n_expert,
                                                                          moe::kWgTile, s.offsets, s.tile_start,
                                                                          s.order);
  K3_CUDA_LAUNCH_CHECK();
  GemmArgs a{p.experts, nullptr, s.offsets, s.tile_start, s.order, p.n_expert, p.k,
             p.d_ff,    p.d_in,  s.zb,      s.h,          p.act,   p.beta1,    p.beta2};
  launch_wgmma(a, true, n_rows, g.stream);
  a.n_out = p.d_in, a.K = p.d_ff, a.x = s.h, a.out = s.o;
  launch_wgmma(a, false, n_rows, g.stream);
}

}  // namespace

size_t moe_experts_scratch_bytes(const MoeExpertsParams& p) { return carve(p, nullptr).bytes; }

// The decode path's version by batch (session 5, H200, K3 shapes): the register version at n_tok = 1 (148 vs
// 164 us), the shared-memory ring of 3 chunks from 2 tokens on (b = 8: 798 vs 879 us; b = 64: 4281 vs 4480
// us; nothing measured between 1 and 8).
constexpr int kRingMinTok = 2;
constexpr int kF16MaxTok = 8;  // the f16 decode path is the default up to here (below)

// variant: 0 = default; bench builds (-DK3_MOE_VARIANTS) add 1 = replicated table, 2 = prefill BT 32,
// 3 = prefill BT 80, 4 = prefill BT 80 + replicated table, 5 = decode on the tensor-core tile kernel (the
// decode path before session 5), 6 / 7 = the decode kernel's register version with 2 / 3 chunks in flight
// per warp, 8 = the register version sized for 5 blocks per SM (some spills), 9 / 10 = the shared-memory
// ring version with 3 / 4 stages, 11 = the register version (1 in flight, 4 blocks per SM) at every n_tok,
// 12 / 13 / 14 = the table version (experts_decode_lut_kernel) with 1 / 2 / 3 chunks in flight per warp where
// decode_lut_ok (n_tok <= 2), else the default; 15 = 13 with its down kernel launched with PDL; 16 = 15 with
// 4 chunks in flight per warp, sized for 2 blocks per SM; 17 = the bulk-copy version where bulk_ok (a
// ring of 4 stages, 4 CTAs per SM), else the default; 18 / 19 = the bulk-copy version with 3 stages and 5
// CTAs / 6 stages and 3 CTAs; 20 = the default decode with the mma prefill kernel; 21 / 22 = the
// half-precision decode path (moe_experts_f16_cuda.cu) with tiles of 2 / 4 rows and 1 chunk of weights in
// flight per warp, 23 / 24 = 22 / 21 with 2 chunks (24 is the default decode up to kF16MaxTok tokens since
// session 22), 30 = 24 with 3 chunks; 31 = the bf16 decode kernels above (the default decode before session
// 22 and from kF16MaxTok + 1 tokens; K3_MOE_F16=0 makes them the default at every size). 21-24, 30 and 31 run
// in every build; 27 = 24 sized for 4 blocks an SM (128 registers); 32 = 24 with its launches as one PDL
// chain (run_decode_f16's `pdl`; the default since session 24 unless K3_MOE_PDL=0).
// (Measured slower or no faster and removed: session 23's persistent f16 kernel, in git 99e50ce; session 24's
// 25 = 24 with a high-byte nibble decode and 26 = 24 with fused epilogues, in git 51d93f0; decision gpu.12.)
// Prefill runs on the wgmma kernel only at variant 0 (where moe::wg_ok and path != prefill_mma).
void moe_experts_cuda_variant(const MoeExpertsParams& p, GpuContext& g, int variant);

void moe_experts_cuda(const MoeExpertsParams& p, GpuContext& g) { moe_experts_cuda_variant(p, g, 0); }

void moe_experts_cuda_variant(const MoeExpertsParams& p, GpuContext& g, int variant) {
  K3_ASSERT(moe_experts_check(p).ok());
  K3_ASSERT(p.scratch != nullptr || p.n_tok == 0);
  if (p.n_tok == 0) return;
  const Scratch s = carve(p, p.scratch);
  const int64_t n_rows = p.n_tok * p.k;
  K3_ASSERT(n_rows < (int64_t(1) << 31));
  const bool decode =
      p.path == MoePath::decode || (p.path == MoePath::automatic && p.n_tok <= kMoeDecodeMaxTok);
  // the half-precision decode path (moe_experts_f16_cuda.cu): the default decode up to kF16MaxTok tokens
  // (tiles of 2 rows, 2 chunks of weights in flight a warp) unless K3_MOE_F16=0 (read once); variants 21-24,
  // 30 take it at any decode size. Session 22, H100: 0.90-0.92x the bf16 kernels' time at 1-8 tokens in
  // bench_moe, 0.94-0.96x in the slices' MoE module at B = 1 / 8; 0.98x in bench_moe at 64 but 1.02-1.07x in
  // the slices' MoE module at B = 64, whose routing gives experts more rows (an expert of r rows is read
  // ceil(r / 2) times, against ceil(r / 8))
  static const bool f16_env = env_switch("K3_MOE_F16", true);
  // the f16 decode's launches as one PDL chain unless K3_MOE_PDL=0 (variant 32 = 24 with it, whatever the
  // switch). Session 24, H100: b1 134.3 vs 137.3 us graph-timed, K3 slice B = 1 3.282 vs 3.308 ms; same bits
  static const bool pdl_env = env_switch("K3_MOE_PDL", true);
  const bool f16 = decode && p.n_tok <= kMoeDecodeMaxTok &&
                   ((variant == 0 && f16_env && p.n_tok <= kF16MaxTok) || (variant >= 21 && variant <= 24) ||
                    variant == 27 || variant == 30 || variant == 32);
  if (f16) {
    const int T = variant == 22 || variant == 23 ? 4 : 2;
    const int depth = variant == 21 || variant == 22 ? 1 : variant == 30 ? 3 : 2;
    run_decode_f16(p, s, n_rows, g, T, depth, variant == 27, (variant == 0 && pdl_env) || variant == 32);
    return;
  }
#ifdef K3_MOE_VARIANTS
  const bool stream = decode && variant != 1 && variant != 4 && variant != 5;  // the decode kernel
  const bool lut = stream && variant >= 12 && variant <= 16 && decode_lut_ok(p);  // its table version
#else
  const bool stream = decode, lut = false;
  (void)variant;
#endif
  const bool wg = !decode && variant == 0 && p.path != MoePath::prefill_mma && moe::wg_ok(p.d_in, p.d_ff);
  to_bf16_kernel<<<unsigned((p.n_tok * p.d_in + 255) / 256), 256, 0, g.stream>>>(
      p.z, p.ldz ? p.ldz : p.d_in, p.n_tok, p.d_in,
      stream && !lut ? XOrder::unit : wg ? XOrder::wg : XOrder::natural, s.zb);
  K3_CUDA_LAUNCH_CHECK();
#ifdef K3_MOE_VARIANTS
  if (stream && !lut && bulk_ok(p) && variant == 17) {
    run_decode<4, 1, 4, false, false, true>(p, s, n_rows, g);
  } else if (stream && !lut && bulk_ok(p) && variant == 18) {
    run_decode<3, 1, 5, false, false, true>(p, s, n_rows, g);
  } else if (stream && !lut && bulk_ok(p) && variant == 19) {
    run_decode<6, 1, 3, false, false, true>(p, s, n_rows, g);
  } else
#endif
      if (stream) {
#ifdef K3_MOE_VARIANTS
    if (lut && variant == 12)
      run_decode<0, 1, 3, true>(p, s, n_rows, g);
    else if (lut && variant == 13)
      run_decode<0, 2, 3, true>(p, s, n_rows, g);
    else if (lut && variant == 14)
      run_decode<0, 3, 3, true>(p, s, n_rows, g);
    else if (lut && variant == 15)
      run_decode<0, 2, 3, true, true>(p, s, n_rows, g);
    else if (lut && variant == 16)
      run_decode<0, 4, 2, true, true>(p, s, n_rows, g);
    else if (variant == 6)
      run_decode<0, 2, 3>(p, s, n_rows, g);
    else if (variant == 7)
      run_decode<0, 3, 2>(p, s, n_rows, g);
    else if (variant == 8)
      run_decode<0, 1, 5>(p, s, n_rows, g);
    else if (variant == 9)
      run_decode<3, 1, 4>(p, s, n_rows, g);
    else if (variant == 10)
      run_decode<4, 1, 3>(p, s, n_rows, g);
    else if (variant == 11)
      run_decode<0, 1, 4>(p, s, n_rows, g);
    else
#endif
        if (p.n_tok >= kRingMinTok)
      run_decode<3, 1, 4>(p, s, n_rows, g);
    else
      run_decode<0, 1, 4>(p, s, n_rows, g);
  } else {
#ifdef K3_MOE_VARIANTS
    if (variant == 1 || (variant == 4 && decode))
      decode ? run_path<8, true>(p, s, n_rows, g) : run_path<64, true>(p, s, n_rows, g);
    else if (variant == 2 && !decode)
      run_path<32>(p, s, n_rows, g);
    else if (variant == 3 && !decode)
      run_path<80>(p, s, n_rows, g);
    else if (variant == 4)
      run_path<80, true>(p, s, n_rows, g);
    else
#endif
        if (decode)
      run_path<moe::kDecodeTile>(p, s, n_rows, g);
    else if (wg)
      run_wg(p, s, n_rows, g);
    else
      run_path<moe::kPrefillTile>(p, s, n_rows, g);
  }
  combine(p, s, g);
}

}  // namespace k3
