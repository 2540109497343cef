// mla_decode_cuda.cu: absorbed MLA decode over the paged latent cache on the GPU (contract: mla_decode.h).
//
// Split-KV (flash-decoding). Sequence b's tokens [0, ctx_len[b]) are cut into n_split ranges of split_len
// tokens (a multiple of the 64-token tile). A CTA (head group g, split s, seq b) streams its range tile by
// tile into shared memory, each 576-wide row ONCE for every head of the group, and keeps per head the fp32
// running max m, sum l and unnormalized output o (512); mla_combine merges the splits:
//   M = max_s m_s,  out = sum_s exp(m_s - M) o_s / sum_s exp(m_s - M) l_s.
// Partials (workspace): o [n_seq, n_split, n_head, 512] then ml [n_seq, n_split, n_head, 2], fp32.
//
// mla_split_mma: 32 heads (two m16 tiles) per CTA, 8 warps, 64-token tiles double-buffered by cp.async.
//   S = Q (32 x 576) K^T (576 x 64): warp w -> head tile w/4, tokens 16 (w%4) .. +16, mma m16n8k16 bf16.
//   softmax over the tile in shared memory (8 threads a row), P rounded to bf16.
//   O += P (32 x 64) V (64 x 512): warp w -> head tile w/4, dims 128 (w%4) .. +128 (64 fp32 accumulators).
// mla_split_simple: 8 heads per CTA on CUDA cores (warp = head for the scores, thread = 2 dims for o).
#include <cuda_bf16.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>

#include "ops/cuda_util.cuh"
#include "ops/mla_decode.h"

namespace k3 {
namespace {

constexpr int kTile = 64;                 // tokens per shared-memory tile (and split_len granularity)
constexpr int kStride = kMlaRow + 8;      // padded smem row (bf16): 1168 B, ldmatrix rows hit distinct banks
constexpr int kChunks = kMlaRow / 8;      // 16-byte chunks per row (72)
constexpr int kMmaHeads = 32, kMmaThreads = 256;
constexpr int kPStride = kTile + 8;       // bf16 P row
constexpr int kSStride = kTile + 4;       // fp32 S row
constexpr size_t kMmaSmem = size_t(kMmaHeads) * kStride * 2 + size_t(2) * kTile * kStride * 2 +
                            size_t(kMmaHeads) * kSStride * 4 + size_t(kMmaHeads) * kPStride * 2 +
                            size_t(3) * kMmaHeads * 4;
constexpr int kSimpleHeads = 8, kSimpleTile = 32, kSimpleThreads = 256;

struct Split {
  int n_split, split_len;
};

Split choose_split(const MlaDecodeParams& p, int heads_per_cta, int want) {
  int n = want;
  if (n <= 0) {
    static int sms = [] {
      int dev = 0, v = 0;
      K3_CUDA_ASSERT(cudaGetDevice(&dev));
      K3_CUDA_ASSERT(cudaDeviceGetAttribute(&v, cudaDevAttrMultiProcessorCount, dev));
      return v;
    }();
    // fewest splits that fill every SM with whole waves (>= 85% of the last wave busy): fewer splits
    // mean fewer partials to write and combine (at batch 1 they rival the cache bytes)
    const int ctas = p.n_seq * ((p.n_head + heads_per_cta - 1) / heads_per_cta);
    const int n_max = (p.max_ctx + kTile - 1) / kTile;
    n = std::min(n_max, std::max(1, (sms + ctas - 1) / ctas));
    for (int c = n; c <= n_max; ++c) {
      const int64_t total = int64_t(ctas) * c, waves = (total + sms - 1) / sms;
      if (double(total) >= 0.85 * double(waves * sms)) {
        n = c;
        break;
      }
    }
  }
  n = std::min(n, (p.max_ctx + kTile - 1) / kTile);
  const int len = ((p.max_ctx + n - 1) / n + kTile - 1) / kTile * kTile;
  return {(p.max_ctx + len - 1) / len, len};
}

size_t partial_bytes(const MlaDecodeParams& p, int n_split) {
  return size_t(p.n_seq) * n_split * p.n_head * (kMlaLatent + 2) * sizeof(float);
}

// Fits the partials into g.workspace (fewer, longer splits when it is small).
Split fit_split(const MlaDecodeParams& p, const GpuContext& g, int heads_per_cta) {
  K3_ASSERT(mla_decode_check(p).ok());
  Split s = choose_split(p, heads_per_cta, p.n_split);
  while (partial_bytes(p, s.n_split) > g.workspace_bytes && s.n_split > 1)
    s = choose_split(p, heads_per_cta, s.n_split / 2);
  K3_ASSERT(g.workspace && partial_bytes(p, s.n_split) <= g.workspace_bytes);
  return s;
}

__device__ __forceinline__ const uint16_t* row_ptr(const MlaDecodeParams& p, int b, int t) {
  const int page = p.block_table[size_t(b) * p.max_pages + t / p.page_size];
  return p.cache + (size_t(page) * p.page_size + t % p.page_size) * kMlaRow;
}

__device__ __forceinline__ uint32_t smem_addr(const void* ptr) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(ptr));
}

__device__ __forceinline__ void ldsm_x4(uint32_t addr, uint32_t (&r)[4]) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(addr));
}
__device__ __forceinline__ void ldsm_x4_trans(uint32_t addr, uint32_t (&r)[4]) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(addr));
}
// c (16x8 fp32) += a (16x16 bf16, row) b (16x8 bf16, col)
__device__ __forceinline__ void mma_bf16(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// Issues cp.async for tile [t0, t0 + kTile) of sequence b into rows (zeros past t_end). Thread -> token
// tid / 4 (one block-table read), 16-byte chunks tid % 4 + 4 i: four threads cover 64 contiguous bytes.
__device__ __forceinline__ void load_tile(const MlaDecodeParams& p, int b, int t0, int t_end, uint16_t* rows) {
  static_assert(kMmaThreads == 4 * kTile && kChunks % 4 == 0, "4 threads per token row");
  const int tok = threadIdx.x / 4, t = t0 + tok;
  uint16_t* dst = rows + tok * kStride + (threadIdx.x % 4) * 8;
  if (t < t_end) {
    const uint16_t* src = row_ptr(p, b, t) + (threadIdx.x % 4) * 8;
#pragma unroll
    for (int i = 0; i < kChunks / 4; ++i)
      asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(smem_addr(dst + i * 32)), "l"(src + i * 32));
  } else {
#pragma unroll
    for (int i = 0; i < kChunks / 4; ++i) *reinterpret_cast<uint4*>(dst + i * 32) = make_uint4(0, 0, 0, 0);
  }
  asm volatile("cp.async.commit_group;\n");
}

__global__ void __launch_bounds__(kMmaThreads, 1)
    mla_split_mma(MlaDecodeParams p, int n_split, int split_len, float* part_o, float* part_ml) {
  extern __shared__ __align__(16) unsigned char smem[];
  uint16_t* q_s = reinterpret_cast<uint16_t*>(smem);                    // [32][kStride]
  uint16_t* k_s = q_s + kMmaHeads * kStride;                            // [2][64][kStride]
  float* s_s = reinterpret_cast<float*>(k_s + 2 * kTile * kStride);    // [32][kSStride]
  uint16_t* p_s = reinterpret_cast<uint16_t*>(s_s + kMmaHeads * kSStride);  // [32][kPStride]
  float* m_s = reinterpret_cast<float*>(p_s + kMmaHeads * kPStride);   // [32] running max
  float* l_s = m_s + kMmaHeads;                                         // [32] running sum
  float* a_s = l_s + kMmaHeads;                                         // [32] rescale of this tile

  const int b = blockIdx.z, split = blockIdx.y, h0 = blockIdx.x * kMmaHeads;
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32, mt = warp / 4, wq = warp % 4;
  const int n = p.ctx_len[b], t_begin = split * split_len, t_end = min(n, t_begin + split_len);
  const int n_tiles = t_end > t_begin ? (t_end - t_begin + kTile - 1) / kTile : 0;

  if (n_tiles > 0) load_tile(p, b, t_begin, t_end, k_s);
  for (int c = tid; c < kMmaHeads * kChunks; c += kMmaThreads) {  // q (bf16) once; zero rows past n_head
    const int r = c / kChunks, part = c % kChunks;
    uint4 v = make_uint4(0, 0, 0, 0);
    if (h0 + r < p.n_head)
      v = *reinterpret_cast<const uint4*>(p.q + (size_t(b) * p.n_head + h0 + r) * kMlaRow + part * 8);
    *reinterpret_cast<uint4*>(q_s + r * kStride + part * 8) = v;
  }
  if (tid < kMmaHeads) m_s[tid] = -INFINITY, l_s[tid] = 0.f;

  float acc[16][4];
#pragma unroll
  for (int j = 0; j < 16; ++j) acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.f;

  for (int it = 0; it < n_tiles; ++it) {
    const int t0 = t_begin + it * kTile;
    const uint16_t* rows = k_s + (it % 2) * kTile * kStride;
    if (it + 1 < n_tiles) {
      load_tile(p, b, t0 + kTile, t_end, k_s + ((it + 1) % 2) * kTile * kStride);
      asm volatile("cp.async.wait_group 1;\n");
    } else {
      asm volatile("cp.async.wait_group 0;\n");
    }
    __syncthreads();
    // S = scale * Q K^T for heads mt*16.., tokens wq*16 .. +16
    float sc[2][4] = {}, sc_odd[2][4] = {};  // even / odd k-steps: two mma chains per n-tile (latency)
    {
      const uint32_t qa = smem_addr(q_s + (mt * 16 + (lane & 15)) * kStride + (lane >> 4) * 8);
      const uint32_t ka =
          smem_addr(rows + (wq * 16 + (lane & 7) + ((lane >> 4) << 3)) * kStride + ((lane >> 3) & 1) * 8);
#pragma unroll 4
      for (int kk = 0; kk < kMlaRow / 16; ++kk) {
        uint32_t a[4], bb[4];
        ldsm_x4(qa + kk * 32, a);
        ldsm_x4(ka + kk * 32, bb);
        mma_bf16(kk % 2 ? sc_odd[0] : sc[0], a, bb[0], bb[1]);
        mma_bf16(kk % 2 ? sc_odd[1] : sc[1], a, bb[2], bb[3]);
      }
#pragma unroll
      for (int nt = 0; nt < 2; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) sc[nt][e] += sc_odd[nt][e];
    }
#pragma unroll
    for (int nt = 0; nt < 2; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int row = mt * 16 + lane / 4 + (e / 2) * 8, col = wq * 16 + nt * 8 + (lane % 4) * 2 + e % 2;
        s_s[row * kSStride + col] = t0 + col < t_end ? sc[nt][e] * p.scale : -INFINITY;
      }
    __syncthreads();
    {  // online softmax: 8 threads per head row, 8 tokens each
      const int r = tid / 8, j = tid % 8;
      float v[8], mx = -INFINITY;
#pragma unroll
      for (int i = 0; i < 8; ++i) mx = fmaxf(mx, v[i] = s_s[r * kSStride + j * 8 + i]);
      for (int o = 1; o < 8; o <<= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
      const float m_old = m_s[r], m_new = fmaxf(m_old, mx);  // finite: a tile holds >= 1 valid token
      float sum = 0.f;
#pragma unroll
      for (int i = 0; i < 8; ++i) {
        const __nv_bfloat16 pb = __float2bfloat16_rn(__expf(v[i] - m_new));
        sum += __bfloat162float(pb);
        reinterpret_cast<__nv_bfloat16*>(p_s)[r * kPStride + j * 8 + i] = pb;
      }
      for (int o = 1; o < 8; o <<= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
      __syncwarp();
      if (j == 0) {
        const float alpha = __expf(m_old - m_new);  // m_old = -inf -> 0
        a_s[r] = alpha, m_s[r] = m_new, l_s[r] = l_s[r] * alpha + sum;
      }
    }
    __syncthreads();
    {  // O = alpha O + P V for heads mt*16.., dims wq*128 .. +128
      const float al0 = a_s[mt * 16 + lane / 4], al1 = a_s[mt * 16 + lane / 4 + 8];
#pragma unroll
      for (int j = 0; j < 16; ++j) acc[j][0] *= al0, acc[j][1] *= al0, acc[j][2] *= al1, acc[j][3] *= al1;
      const uint32_t pa = smem_addr(p_s + (mt * 16 + (lane & 15)) * kPStride + (lane >> 4) * 8);
      const uint32_t va =
          smem_addr(rows + ((lane & 7) + ((lane >> 3) & 1) * 8) * kStride + wq * 128 + (lane >> 4) * 8);
#pragma unroll
      for (int kk = 0; kk < kTile / 16; ++kk) {
        uint32_t a[4];
        ldsm_x4(pa + kk * 32, a);
#pragma unroll
        for (int jp = 0; jp < 8; ++jp) {
          uint32_t bb[4];
          ldsm_x4_trans(va + (kk * 16 * kStride + jp * 16) * 2, bb);
          mma_bf16(acc[2 * jp], a, bb[0], bb[1]);
          mma_bf16(acc[2 * jp + 1], a, bb[2], bb[3]);
        }
      }
    }
    __syncthreads();  // rows and p_s are rewritten next tile
  }
  const size_t base = (size_t(b) * n_split + split) * p.n_head;
#pragma unroll
  for (int j = 0; j < 16; ++j)
#pragma unroll
    for (int e2 = 0; e2 < 2; ++e2) {
      const int h = h0 + mt * 16 + lane / 4 + e2 * 8, d = wq * 128 + j * 8 + (lane % 4) * 2;
      if (h < p.n_head)
        *reinterpret_cast<float2*>(part_o + (base + h) * kMlaLatent + d) =
            make_float2(acc[j][2 * e2], acc[j][2 * e2 + 1]);
    }
  if (tid < kMmaHeads && h0 + tid < p.n_head) {
    part_ml[(base + h0 + tid) * 2] = m_s[tid];
    part_ml[(base + h0 + tid) * 2 + 1] = l_s[tid];
  }
}

// mla_split_mma2 (experimental; the environment variable K3_MLA_MMA2=1 picks it in mla_decode_cuda): less shared-memory traffic.
//   Q stays in registers: warp w holds head tile w/4's A fragments for the k-steps 9 (w%4) .. +9 and
//   computes a partial S over all 64 tokens (8 n-tiles, 4 B loads per 8 mma); the 4 partials are summed
//   in shared memory (the q_s region, free after the fragments are loaded).
//   O: warp w -> dims 64 w .. +64 for both head tiles (the V fragments serve 2 m-tiles).
constexpr int kQSteps = kMlaRow / 16 / 4;  // 9 k-steps per warp
constexpr size_t kMma2Smem = size_t(kMmaHeads) * kStride * 2 + size_t(2) * kTile * kStride * 2 +
                             size_t(kMmaHeads) * kPStride * 2 + size_t(3) * kMmaHeads * 4;
static_assert(size_t(4) * kMmaHeads * kSStride * 4 <= size_t(kMmaHeads) * kStride * 2, "S partials fit q_s");

__global__ void __launch_bounds__(kMmaThreads, 1)
    mla_split_mma2(MlaDecodeParams p, int n_split, int split_len, float* part_o, float* part_ml) {
  extern __shared__ __align__(16) unsigned char smem[];
  uint16_t* q_s = reinterpret_cast<uint16_t*>(smem);                  // [32][kStride], then S partials
  float* sp = reinterpret_cast<float*>(smem);                          // [4][32][kSStride]
  uint16_t* k_s = q_s + kMmaHeads * kStride;                          // [2][64][kStride]
  uint16_t* p_s = k_s + 2 * kTile * kStride;                          // [32][kPStride]
  float* m_s = reinterpret_cast<float*>(p_s + kMmaHeads * kPStride);  // [32]
  float* l_s = m_s + kMmaHeads;
  float* a_s = l_s + kMmaHeads;

  const int b = blockIdx.z, split = blockIdx.y, h0 = blockIdx.x * kMmaHeads;
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32, mt = warp / 4, kq = warp % 4;
  const int n = p.ctx_len[b], t_begin = split * split_len, t_end = min(n, t_begin + split_len);
  const int n_tiles = t_end > t_begin ? (t_end - t_begin + kTile - 1) / kTile : 0;

  if (n_tiles > 0) load_tile(p, b, t_begin, t_end, k_s);
  for (int c = tid; c < kMmaHeads * kChunks; c += kMmaThreads) {
    const int r = c / kChunks, part = c % kChunks;
    uint4 v = make_uint4(0, 0, 0, 0);
    if (h0 + r < p.n_head)
      v = *reinterpret_cast<const uint4*>(p.q + (size_t(b) * p.n_head + h0 + r) * kMlaRow + part * 8);
    *reinterpret_cast<uint4*>(q_s + r * kStride + part * 8) = v;
  }
  if (tid < kMmaHeads) m_s[tid] = -INFINITY, l_s[tid] = 0.f;
  __syncthreads();
  uint32_t qf[kQSteps][4];
  {
    const uint32_t qa = smem_addr(q_s + (mt * 16 + (lane & 15)) * kStride + kq * kQSteps * 16 + (lane >> 4) * 8);
#pragma unroll
    for (int kk = 0; kk < kQSteps; ++kk) ldsm_x4(qa + kk * 32, qf[kk]);
  }
  float acc[2][8][4];
#pragma unroll
  for (int m = 0; m < 2; ++m)
#pragma unroll
    for (int j = 0; j < 8; ++j) acc[m][j][0] = acc[m][j][1] = acc[m][j][2] = acc[m][j][3] = 0.f;

  for (int it = 0; it < n_tiles; ++it) {
    const int t0 = t_begin + it * kTile;
    const uint16_t* rows = k_s + (it % 2) * kTile * kStride;
    if (it + 1 < n_tiles) {
      load_tile(p, b, t0 + kTile, t_end, k_s + ((it + 1) % 2) * kTile * kStride);
      asm volatile("cp.async.wait_group 1;\n");
    } else {
      asm volatile("cp.async.wait_group 0;\n");
    }
    __syncthreads();  // tile `it` landed; every warp holds its Q fragments (q_s may be overwritten)
    {
      float sc[8][4];
#pragma unroll
      for (int j = 0; j < 8; ++j) sc[j][0] = sc[j][1] = sc[j][2] = sc[j][3] = 0.f;
      const uint32_t ka = smem_addr(rows + ((lane & 7) + ((lane >> 4) << 3)) * kStride + kq * kQSteps * 16 +
                                    ((lane >> 3) & 1) * 8);
#pragma unroll
      for (int kk = 0; kk < kQSteps; ++kk)
#pragma unroll
        for (int jp = 0; jp < 4; ++jp) {
          uint32_t bb[4];
          ldsm_x4(ka + (jp * 16 * kStride + kk * 16) * 2, bb);
          mma_bf16(sc[2 * jp], qf[kk], bb[0], bb[1]);
          mma_bf16(sc[2 * jp + 1], qf[kk], bb[2], bb[3]);
        }
      float* spw = sp + kq * kMmaHeads * kSStride;
#pragma unroll
      for (int j = 0; j < 8; ++j)
#pragma unroll
        for (int e2 = 0; e2 < 2; ++e2)
          *reinterpret_cast<float2*>(spw + (mt * 16 + lane / 4 + e2 * 8) * kSStride + j * 8 + (lane % 4) * 2) =
              make_float2(sc[j][2 * e2], sc[j][2 * e2 + 1]);
    }
    __syncthreads();
    {  // online softmax: 8 threads per head row, 8 tokens each; S = scale * (sum of the 4 partials)
      const int r = tid / 8, j = tid % 8;
      float v[8], mx = -INFINITY;
#pragma unroll
      for (int i = 0; i < 8; ++i) {
        const int col = j * 8 + i;
        float s = 0.f;
#pragma unroll
        for (int q4 = 0; q4 < 4; ++q4) s += sp[(q4 * kMmaHeads + r) * kSStride + col];
        v[i] = t0 + col < t_end ? s * p.scale : -INFINITY;
        mx = fmaxf(mx, v[i]);
      }
      for (int o = 1; o < 8; o <<= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
      const float m_old = m_s[r], m_new = fmaxf(m_old, mx);
      float sum = 0.f;
#pragma unroll
      for (int i = 0; i < 8; ++i) {
        const __nv_bfloat16 pb = __float2bfloat16_rn(__expf(v[i] - m_new));
        sum += __bfloat162float(pb);
        reinterpret_cast<__nv_bfloat16*>(p_s)[r * kPStride + j * 8 + i] = pb;
      }
      for (int o = 1; o < 8; o <<= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
      if (j == 0) {
        const float alpha = __expf(m_old - m_new);
        a_s[r] = alpha, m_s[r] = m_new, l_s[r] = l_s[r] * alpha + sum;
      }
    }
    __syncthreads();
    {  // O = alpha O + P V: dims 64 warp .. +64, both head tiles
#pragma unroll
      for (int m = 0; m < 2; ++m) {
        const float al0 = a_s[m * 16 + lane / 4], al1 = a_s[m * 16 + lane / 4 + 8];
#pragma unroll
        for (int j = 0; j < 8; ++j)
          acc[m][j][0] *= al0, acc[m][j][1] *= al0, acc[m][j][2] *= al1, acc[m][j][3] *= al1;
      }
      const uint32_t pa = smem_addr(p_s + (lane & 15) * kPStride + (lane >> 4) * 8);
      const uint32_t va =
          smem_addr(rows + ((lane & 7) + ((lane >> 3) & 1) * 8) * kStride + warp * 64 + (lane >> 4) * 8);
#pragma unroll
      for (int kk = 0; kk < kTile / 16; ++kk) {
        uint32_t a0[4], a1[4];
        ldsm_x4(pa + kk * 32, a0);
        ldsm_x4(pa + (16 * kPStride + kk * 16) * 2, a1);
#pragma unroll
        for (int jp = 0; jp < 4; ++jp) {
          uint32_t bb[4];
          ldsm_x4_trans(va + (kk * 16 * kStride + jp * 16) * 2, bb);
          mma_bf16(acc[0][2 * jp], a0, bb[0], bb[1]);
          mma_bf16(acc[0][2 * jp + 1], a0, bb[2], bb[3]);
          mma_bf16(acc[1][2 * jp], a1, bb[0], bb[1]);
          mma_bf16(acc[1][2 * jp + 1], a1, bb[2], bb[3]);
        }
      }
    }
    __syncthreads();
  }
  const size_t base = (size_t(b) * n_split + split) * p.n_head;
#pragma unroll
  for (int m = 0; m < 2; ++m)
#pragma unroll
    for (int j = 0; j < 8; ++j)
#pragma unroll
      for (int e2 = 0; e2 < 2; ++e2) {
        const int h = h0 + m * 16 + lane / 4 + e2 * 8, d = warp * 64 + j * 8 + (lane % 4) * 2;
        if (h < p.n_head)
          *reinterpret_cast<float2*>(part_o + (base + h) * kMlaLatent + d) =
              make_float2(acc[m][j][2 * e2], acc[m][j][2 * e2 + 1]);
      }
  if (tid < kMmaHeads && h0 + tid < p.n_head) {
    part_ml[(base + h0 + tid) * 2] = m_s[tid];
    part_ml[(base + h0 + tid) * 2 + 1] = l_s[tid];
  }
}

__global__ void __launch_bounds__(kSimpleThreads)
    mla_split_simple(MlaDecodeParams p, int n_split, int split_len, float* part_o, float* part_ml) {
  __shared__ __align__(16) uint16_t rows[kSimpleTile * kStride];
  __shared__ __align__(16) uint16_t q_s[kSimpleHeads * kMlaRow];
  __shared__ float p_s[kSimpleHeads][kSimpleTile], a_s[kSimpleHeads];
  const int b = blockIdx.z, split = blockIdx.y, h0 = blockIdx.x * kSimpleHeads;
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int n = p.ctx_len[b], t_begin = split * split_len, t_end = min(n, t_begin + split_len);
  for (int c = tid; c < kSimpleHeads * kChunks; c += kSimpleThreads) {
    const int r = c / kChunks, part = c % kChunks;
    uint4 v = make_uint4(0, 0, 0, 0);
    if (h0 + r < p.n_head)
      v = *reinterpret_cast<const uint4*>(p.q + (size_t(b) * p.n_head + h0 + r) * kMlaRow + part * 8);
    *reinterpret_cast<uint4*>(q_s + r * kMlaRow + part * 8) = v;
  }
  float m = -INFINITY, l = 0.f, acc[kSimpleHeads][2] = {};  // m, l: head h0 + warp (every lane)
  for (int t0 = t_begin; t0 < t_end; t0 += kSimpleTile) {
    __syncthreads();
    for (int c = tid; c < kSimpleTile * kChunks; c += kSimpleThreads) {
      const int tok = c / kChunks, part = c % kChunks;
      uint4 v = make_uint4(0, 0, 0, 0);
      if (t0 + tok < t_end) v = *reinterpret_cast<const uint4*>(row_ptr(p, b, t0 + tok) + part * 8);
      *reinterpret_cast<uint4*>(rows + tok * kStride + part * 8) = v;
    }
    __syncthreads();
    float s = 0.f;  // warp = head, lane = token
    for (int i = 0; i < kMlaRow; i += 2) {
      const float2 k = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(rows + lane * kStride + i));
      const float2 q = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(q_s + warp * kMlaRow + i));
      s = fmaf(q.x, k.x, fmaf(q.y, k.y, s));
    }
    s = t0 + lane < t_end ? s * p.scale : -INFINITY;
    const float m_new = fmaxf(m, cuda_ops::warp_max(s));
    const float pr = __expf(s - m_new), alpha = __expf(m - m_new);
    l = l * alpha + cuda_ops::warp_sum(pr);
    m = m_new;
    p_s[warp][lane] = pr;
    if (lane == 0) a_s[warp] = alpha;
    __syncthreads();
    for (int h = 0; h < kSimpleHeads; ++h) acc[h][0] *= a_s[h], acc[h][1] *= a_s[h];
    for (int t = 0; t < kSimpleTile; ++t) {
      const float2 v = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(rows + t * kStride + 2 * tid));
#pragma unroll
      for (int h = 0; h < kSimpleHeads; ++h) acc[h][0] = fmaf(p_s[h][t], v.x, acc[h][0]), acc[h][1] = fmaf(p_s[h][t], v.y, acc[h][1]);
    }
  }
  const size_t base = (size_t(b) * n_split + split) * p.n_head;
  for (int h = 0; h < kSimpleHeads; ++h)
    if (h0 + h < p.n_head)
      *reinterpret_cast<float2*>(part_o + (base + h0 + h) * kMlaLatent + 2 * tid) = make_float2(acc[h][0], acc[h][1]);
  if (lane == 0 && h0 + warp < p.n_head) part_ml[(base + h0 + warp) * 2] = m, part_ml[(base + h0 + warp) * 2 + 1] = l;
}

// grid (n_head, n_seq), 128 threads x 4 dims.
__global__ void mla_combine(MlaDecodeParams p, int n_split, const float* part_o, const float* part_ml) {
  const int h = blockIdx.x, b = blockIdx.y, d = threadIdx.x * 4;
  float M = -INFINITY;
  for (int s = 0; s < n_split; ++s) M = fmaxf(M, part_ml[((size_t(b) * n_split + s) * p.n_head + h) * 2]);
  float L = 0.f;
  float4 o = make_float4(0.f, 0.f, 0.f, 0.f);
  for (int s = 0; s < n_split; ++s) {
    const size_t i = (size_t(b) * n_split + s) * p.n_head + h;
    const float m = part_ml[i * 2];
    if (m == -INFINITY) continue;  // empty split
    const float w = __expf(m - M);
    L += w * part_ml[i * 2 + 1];
    const float4 v = *reinterpret_cast<const float4*>(part_o + i * kMlaLatent + d);
    o.x += w * v.x, o.y += w * v.y, o.z += w * v.z, o.w += w * v.w;
  }
  const float r = 1.f / L;
  *reinterpret_cast<float4*>(p.out + (size_t(b) * p.n_head + h) * kMlaLatent + d) =
      make_float4(o.x * r, o.y * r, o.z * r, o.w * r);
}

void combine(const MlaDecodeParams& p, const Split& s, float* part_o, GpuContext& g) {
  const float* part_ml = part_o + size_t(p.n_seq) * s.n_split * p.n_head * kMlaLatent;
  mla_combine<<<dim3(p.n_head, p.n_seq), kMlaLatent / 4, 0, g.stream>>>(p, s.n_split, part_o, part_ml);
  K3_CUDA_LAUNCH_CHECK();
}

}  // namespace

size_t mla_decode_workspace_bytes(const MlaDecodeParams& p, int n_split) {
  return partial_bytes(p, n_split > 0 ? n_split : choose_split(p, kMmaHeads, 0).n_split);
}

void mla_decode_cuda(const MlaDecodeParams& p, GpuContext& g) {
  const Split s = fit_split(p, g, kMmaHeads);
  float* part_o = static_cast<float*>(g.workspace);
  float* part_ml = part_o + size_t(p.n_seq) * s.n_split * p.n_head * kMlaLatent;
  static const bool v2 = [] {  // experimental: K3_MLA_MMA2=1 picks mla_split_mma2
    const char* e = std::getenv("K3_MLA_MMA2");
    K3_CUDA_ASSERT(cudaFuncSetAttribute(mla_split_mma, cudaFuncAttributeMaxDynamicSharedMemorySize, int(kMmaSmem)));
    K3_CUDA_ASSERT(cudaFuncSetAttribute(mla_split_mma2, cudaFuncAttributeMaxDynamicSharedMemorySize, int(kMma2Smem)));
    return e && e[0] == '1';
  }();
  const auto kernel = v2 ? mla_split_mma2 : mla_split_mma;
  const size_t smem = v2 ? kMma2Smem : kMmaSmem;
  const dim3 grid((p.n_head + kMmaHeads - 1) / kMmaHeads, s.n_split, p.n_seq);
  kernel<<<grid, kMmaThreads, smem, g.stream>>>(p, s.n_split, s.split_len, part_o, part_ml);
  K3_CUDA_LAUNCH_CHECK();
  combine(p, s, part_o, g);
}

void mla_decode_cuda_simple(const MlaDecodeParams& p, GpuContext& g) {
  const Split s = fit_split(p, g, kSimpleHeads);
  float* part_o = static_cast<float*>(g.workspace);
  float* part_ml = part_o + size_t(p.n_seq) * s.n_split * p.n_head * kMlaLatent;
  const dim3 grid((p.n_head + kSimpleHeads - 1) / kSimpleHeads, s.n_split, p.n_seq);
  mla_split_simple<<<grid, kSimpleThreads, 0, g.stream>>>(p, s.n_split, s.split_len, part_o, part_ml);
  K3_CUDA_LAUNCH_CHECK();
  combine(p, s, part_o, g);
}

}  // namespace k3
