// dsa_index_cuda.cu: DSA index-key store and tensor-core index scores over the paged key cache (dsa_index.h).
//
// index_kernel<KS, NT, MODE>: KS = Di / 16 k-steps, NT = head tiles of 8 (heads past Hi are zero), MODE:
// bf16, bf16 exact (q = hi + lo, two mma), or fp8 (e4m3 keys widened to f16 pairs in registers, q scaled per
// head into [-1, 1] in f16, the scale folded into w). mma m16n8k16: A = 16 keys x 16 dims from shared
// memory, B = the query's q^T fragments held in registers, C = scores [16 keys x 8 heads]; the epilogue forms
// sum_h w_h relu(c) per key (per-lane sum over its 2 heads of each tile, shuffles over the 4 lanes of a row).
// Instantiated for (Di, Hi) = (128, 25..32) (K3.1: bf16, exact, fp8) and (16, 1..8) (tiny-k31: bf16); other
// shapes run index_simple_kernel (CUDA cores, one thread per score, the same contract).
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <algorithm>
#include <atomic>
#include <cstdint>

#include "ops/cuda_util.cuh"
#include "ops/dsa_index.h"

namespace k3 {
namespace {

constexpr int kThreads = 128;      // 4 warps
constexpr int kTileKeys = 64;      // keys per shared-memory stage
constexpr int kStagesDefault = 3;  // key tiles in the cp.async ring (DsaIndexParams::stages: 6, bf16)
constexpr int kQStride = 128 + 8;  // floats a q row in shared memory (decode; Di <= 128)

enum Mode { kBf16 = 0, kExact = 1, kFp8 = 2 };

// index_kernel's shared memory: the ring of key tiles (rows padded by 16 B: conflict-free ldmatrix / pair
// loads), then the fp8 scales of each stage, then (decode) the query's NT * 8 q rows of kQStride floats.
constexpr int row_bytes(int Di, int mode) {
  return (mode == kFp8 ? Di : 2 * Di) + 16;
}
constexpr size_t ring_bytes(int Di, int mode, int stages) {  // = the offset of the q rows
  return size_t(stages) * kTileKeys * row_bytes(Di, mode) +
         (mode == kFp8 ? size_t(stages) * kTileKeys * 4 : 0);
}
constexpr size_t q_bytes(int NT) {
  return size_t(NT) * 8 * kQStride * 4;
}

__host__ __device__ __forceinline__ size_t dsa_key_page_bytes_dev(DsaKeyFormat fmt, int page_size,
                                                                  int d_head) {
  return size_t(page_size) * (fmt == DsaKeyFormat::bf16 ? size_t(d_head) * 2 : size_t(d_head) + 4);
}

__device__ __forceinline__ const uint8_t* page_base(const DsaKeyCache& c, int b, int64_t s,
                                                    size_t page_bytes) {
  const int32_t page = c.block_table[int64_t(b) * c.max_pages + s / c.page_size];
  return static_cast<const uint8_t*>(c.pages) + size_t(page) * page_bytes;
}

__device__ __forceinline__ void cp_async16(void* smem, const void* gmem) {
  const uint32_t s = uint32_t(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(s), "l"(gmem));
}
__device__ __forceinline__ void cp_async4(void* smem, const void* gmem) {
  const uint32_t s = uint32_t(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4;\n" ::"r"(s), "l"(gmem));
}
__device__ __forceinline__ void cp_commit() {
  asm volatile("cp.async.commit_group;\n" ::);
}
template <int N>
__device__ __forceinline__ void cp_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

__device__ __forceinline__ void ldmatrix_x4(uint32_t r[4], const void* smem) {
  const uint32_t s = uint32_t(__cvta_generic_to_shared(smem));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(s));
}

template <bool kF16>
__device__ __forceinline__ void mma(float c[4], const uint32_t a[4], const uint32_t b[2]) {
  if constexpr (kF16)
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
  else
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&v);
}
__device__ __forceinline__ uint32_t pack_f16(float lo, float hi) {
  const __half2 v = __floats2half2_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&v);
}
__device__ __forceinline__ uint32_t e4m3x2_to_f16x2(uint16_t v) {
  const __half2_raw h = __nv_cvt_fp8x2_to_halfraw2(__nv_fp8x2_storage_t(v), __NV_E4M3);
  return uint32_t(h.x) | (uint32_t(h.y) << 16);
}

// Query i's context length and sequence.
__device__ __forceinline__ int64_t ctx_of(const DsaIndexParams& p, int i) {
  return p.ctx_len ? int64_t(p.ctx_len[i]) : p.n_past + i + 1;
}

// Tile t of [k0, k1) of sequence b into stage `stage`: key rows (and fp8 scales) by cp.async; a thread copies
// the same 16-byte column of rows r0, r0 + kStep, ... Tiles start at multiples of kTileKeys, so where pages
// hold whole tiles (P % kTileKeys == 0, as K3.1's P = 64) the tile is one page: one block-table read and no
// division per row; otherwise each row finds its page. Positions fit 32 bits (contexts <= 2^30).
template <int Di, bool kF8, int kRowBytes>
__device__ __forceinline__ void load_tile(const DsaIndexParams& p, uint8_t* smem, float* sc_smem, int b,
                                          int64_t k0, int64_t k1, size_t page_bytes, int t, int stage) {
  constexpr int kKeyBytes = kF8 ? Di : 2 * Di;
  constexpr int kChunks = kKeyBytes / 16;  // 16-byte chunks per key row
  constexpr int kStep = kThreads / kChunks;
  static_assert(kThreads % kChunks == 0 && kTileKeys % kStep == 0, "a thread keeps one column of chunks");
  const int s0 = int(k0) + t * kTileKeys, n_rows = int(std::min<int64_t>(kTileKeys, k1 - s0));
  const int P = p.cache.page_size, ch = threadIdx.x % kChunks, r0 = threadIdx.x / kChunks;
  const int32_t* table = p.cache.block_table + int64_t(b) * p.cache.max_pages;
  const uint8_t* pages = static_cast<const uint8_t*>(p.cache.pages);
  uint8_t* dst = smem + stage * kTileKeys * kRowBytes + ch * 16;
  float* sc_dst = sc_smem + stage * kTileKeys;
  if (P % kTileKeys == 0) {
    const uint8_t* page = pages + size_t(table[s0 / P]) * page_bytes;
    const int slot0 = s0 % P;
    const uint8_t* src = page + size_t(slot0) * kKeyBytes + ch * 16;
#pragma unroll
    for (int i = 0; i < kTileKeys / kStep; ++i) {
      const int r = r0 + i * kStep;
      if (r < n_rows) cp_async16(dst + r * kRowBytes, src + r * kKeyBytes);
    }
    if constexpr (kF8) {
      const float* sc = reinterpret_cast<const float*>(page + size_t(P) * Di) + slot0;
      for (int r = threadIdx.x; r < n_rows; r += kThreads) cp_async4(sc_dst + r, sc + r);
    }
    return;
  }
  for (int r = r0; r < n_rows; r += kStep) {
    const int s = s0 + r;
    const uint8_t* page = pages + size_t(table[s / P]) * page_bytes;
    cp_async16(dst + r * kRowBytes, page + size_t(s % P) * kKeyBytes + ch * 16);
  }
  if constexpr (kF8) {
    for (int r = threadIdx.x; r < n_rows; r += kThreads) {
      const int s = s0 + r;
      const uint8_t* page = pages + size_t(table[s / P]) * page_bytes;
      cp_async4(sc_dst + r, page + size_t(P) * Di + size_t(s % P) * 4);
    }
  }
}

template <int KS, int NT, int MODE, int kStages>
__global__ void __launch_bounds__(kThreads) index_kernel(DsaIndexParams p, int qpc, int64_t keys_per_cta) {
  constexpr int Di = KS * 16;
  constexpr bool kF8 = MODE == kFp8;
  constexpr int kRowBytes = row_bytes(Di, MODE);
  extern __shared__ __align__(16) uint8_t smem[];
  float* sc_smem = reinterpret_cast<float*>(smem + kStages * kTileKeys * kRowBytes);  // fp8: [stage][key]

  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int i0 = int(blockIdx.y) * qpc;
  const int n_qc = min(qpc, p.n_q - i0);
  const int b = p.ctx_len ? i0 : 0;  // decode: qpc == 1
  const int64_t n_max = ctx_of(p, i0 + n_qc - 1);
  const int64_t k0 = int64_t(blockIdx.x) * keys_per_cta, k1 = min(n_max, k0 + keys_per_cta);
  if (k0 >= k1) return;
  const int n_tiles = int((k1 - k0 + kTileKeys - 1) / kTileKeys);
  const size_t page_bytes = dsa_key_page_bytes_dev(p.cache.fmt, p.cache.page_size, Di);

  // the first tiles' loads fly while the q fragments are built
#pragma unroll
  for (int st = 0; st < kStages - 1; ++st) {
    if (st < n_tiles) load_tile<Di, kF8, kRowBytes>(p, smem, sc_smem, b, k0, k1, page_bytes, st, st);
    cp_commit();
  }
  // This warp's query: q fragments (B operand) and head weights in registers. Decode (one query a CTA):
  // the query's q rows are first copied into shared memory by 16-byte loads (one round trip), rows padded by
  // 8 floats so the fragments' 8-byte reads are conflict-free; prefill warps read their own query's q.
  const int qs = warp % qpc, qi = i0 + qs;
  const bool q_ok = qs < n_qc;
  const int H = p.n_head;
  uint32_t bq[NT][KS][2], bl[MODE == kExact ? NT : 1][MODE == kExact ? KS : 1][2];
  float wv[NT][2];
  {
    const float* q = p.q + int64_t(q_ok ? qi : i0) * H * Di;
    const bool staged = qpc == 1;
    float* q_smem = reinterpret_cast<float*>(smem + ring_bytes(Di, MODE, kStages));
    if (staged) {
      constexpr int kVecs = Di / 4;  // float4 a row
      if ((reinterpret_cast<uintptr_t>(q) & 15) == 0) {
        for (int v = threadIdx.x; v < H * kVecs; v += kThreads)
          reinterpret_cast<float4*>(q_smem)[(v / kVecs) * (kQStride / 4) + v % kVecs] =
              reinterpret_cast<const float4*>(q)[v];
      } else {
        for (int v = threadIdx.x; v < H * Di; v += kThreads) q_smem[(v / Di) * kQStride + v % Di] = q[v];
      }
      __syncthreads();
    }
    // q[h, e], q[h, e + 1] (e even)
    auto qpair = [&](int h, int e) {
      if (h >= H) return make_float2(0.f, 0.f);
      if (staged) return *reinterpret_cast<const float2*>(q_smem + h * kQStride + e);
      return make_float2(q[h * Di + e], q[h * Di + e + 1]);
    };
    float sq[NT];
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) {
      const int h = nt * 8 + lane / 4;
      float m = 0.f;
      if (kF8 && h < H)
#pragma unroll
        for (int ks = 0; ks < KS; ++ks)
#pragma unroll
          for (int r = 0; r < 2; ++r) {
            const float2 x = qpair(h, ks * 16 + (lane % 4) * 2 + r * 8);
            m = fmaxf(m, fmaxf(fabsf(x.x), fabsf(x.y)));
          }
      m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, 1));
      m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, 2));
      sq[nt] = m > 0.f ? m : 1.f;
#pragma unroll
      for (int ks = 0; ks < KS; ++ks)
#pragma unroll
        for (int r = 0; r < 2; ++r) {
          const int e = ks * 16 + (lane % 4) * 2 + r * 8;
          const float2 x = qpair(h, e);
          const float x0 = x.x, x1 = x.y;
          if constexpr (kF8) {
            bq[nt][ks][r] = pack_f16(x0 / sq[nt], x1 / sq[nt]);
          } else {
            bq[nt][ks][r] = pack_bf16(x0, x1);
            if constexpr (MODE == kExact) {
              const float h0 = __bfloat162float(__float2bfloat16_rn(x0)),
                          h1 = __bfloat162float(__float2bfloat16_rn(x1));
              bl[nt][ks][r] = pack_bf16(x0 - h0, x1 - h1);
            }
          }
        }
    }
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
      for (int j = 0; j < 2; ++j) {
        const int h = nt * 8 + (lane % 4) * 2 + j;
        float wh = h < H ? p.w[int64_t(q_ok ? qi : i0) * H + h] : 0.f;
        if constexpr (kF8) wh *= __shfl_sync(0xffffffffu, sq[nt], ((lane % 4) * 2 + j) * 4);
        wv[nt][j] = wh;
      }
  }
  const int64_t n_q_ctx = q_ok ? ctx_of(p, qi) : 0;
  float* out = p.score + int64_t(q_ok ? qi : i0) * p.ld;

  const int wpq = 4 / qpc;  // warps per query
  for (int t = 0; t < n_tiles; ++t) {
    cp_wait<kStages - 2>();
    __syncthreads();
    if (t + kStages - 1 < n_tiles)
      load_tile<Di, kF8, kRowBytes>(p, smem, sc_smem, b, k0, k1, page_bytes, t + kStages - 1,
                                    (t + kStages - 1) % kStages);
    cp_commit();
    const int stage = t % kStages;
    const uint8_t* tile = smem + stage * kTileKeys * kRowBytes;
    const int64_t s_tile = k0 + int64_t(t) * kTileKeys;
    if (!q_ok) continue;
    for (int mt = warp / qpc; mt < kTileKeys / 16; mt += wpq) {
      if (s_tile + mt * 16 >= min(k1, n_q_ctx)) break;
      float acc[NT][4];
#pragma unroll
      for (int nt = 0; nt < NT; ++nt) acc[nt][0] = acc[nt][1] = acc[nt][2] = acc[nt][3] = 0.f;
#pragma unroll
      for (int ks = 0; ks < KS; ++ks) {
        uint32_t a[4];
        if constexpr (kF8) {
          const uint8_t* r0 = tile + (mt * 16 + lane / 4) * kRowBytes + ks * 16 + (lane % 4) * 2;
          a[0] = e4m3x2_to_f16x2(*reinterpret_cast<const uint16_t*>(r0));
          a[1] = e4m3x2_to_f16x2(*reinterpret_cast<const uint16_t*>(r0 + 8 * kRowBytes));
          a[2] = e4m3x2_to_f16x2(*reinterpret_cast<const uint16_t*>(r0 + 8));
          a[3] = e4m3x2_to_f16x2(*reinterpret_cast<const uint16_t*>(r0 + 8 * kRowBytes + 8));
        } else {
          ldmatrix_x4(a, tile + (mt * 16 + lane % 16) * kRowBytes + ks * 32 + (lane / 16) * 16);
        }
#pragma unroll
        for (int nt = 0; nt < NT; ++nt) {
          mma<kF8>(acc[nt], a, bq[nt][ks]);
          if constexpr (MODE == kExact) mma<false>(acc[nt], a, bl[nt][ks]);
        }
      }
      float r0 = 0.f, r1 = 0.f;
#pragma unroll
      for (int nt = 0; nt < NT; ++nt) {
        r0 += wv[nt][0] * fmaxf(acc[nt][0], 0.f) + wv[nt][1] * fmaxf(acc[nt][1], 0.f);
        r1 += wv[nt][0] * fmaxf(acc[nt][2], 0.f) + wv[nt][1] * fmaxf(acc[nt][3], 0.f);
      }
      r0 += __shfl_xor_sync(0xffffffffu, r0, 1);
      r1 += __shfl_xor_sync(0xffffffffu, r1, 1);
      r0 += __shfl_xor_sync(0xffffffffu, r0, 2);
      r1 += __shfl_xor_sync(0xffffffffu, r1, 2);
      if (lane % 4 == 0) {
        const int rr = mt * 16 + lane / 4;
        const int64_t s = s_tile + rr;
        float m0 = p.scale, m1 = p.scale;
        if constexpr (kF8) m0 *= sc_smem[stage * kTileKeys + rr], m1 *= sc_smem[stage * kTileKeys + rr + 8];
        if (s < k1 && s < n_q_ctx) out[s] = r0 * m0;
        if (s + 8 < k1 && s + 8 < n_q_ctx) out[s + 8] = r1 * m1;
      }
    }
  }
}

// Any supported shape on CUDA cores: one thread per (query, position), fp32 sums in the reference's order.
__global__ void index_simple_kernel(DsaIndexParams p) {
  const int i = blockIdx.y;
  const int64_t s = int64_t(blockIdx.x) * blockDim.x + threadIdx.x, n = ctx_of(p, i);
  if (s >= n) return;
  const int b = p.ctx_len ? i : 0, Di = p.cache.d_head, H = p.n_head;
  const bool f8 = p.cache.fmt == DsaKeyFormat::fp8;
  const uint8_t* base = page_base(p.cache, b, s, dsa_key_page_bytes_dev(p.cache.fmt, p.cache.page_size, Di));
  const int64_t slot = s % p.cache.page_size;
  const float ksc = f8 ? reinterpret_cast<const float*>(base + size_t(p.cache.page_size) * Di)[slot] : 1.f;
  const uint8_t* kr = base + slot * (f8 ? Di : 2 * Di);
  const float* q = p.q + int64_t(i) * H * Di;
  float acc = 0.f;
  for (int h = 0; h < H; ++h) {
    float d = 0.f;
    for (int e = 0; e < Di; ++e) {
      float k;
      if (f8) {
        k = ksc * float(__half(__nv_cvt_fp8_to_halfraw(kr[e], __NV_E4M3)));
      } else {
        k = __bfloat162float(reinterpret_cast<const __nv_bfloat16*>(kr)[e]);
      }
      const float qv = q[h * Di + e];
      d += (p.q_exact || f8 ? qv : cuda_ops::round_bf16_dev(qv)) * k;
    }
    acc += p.w[int64_t(i) * H + h] * fmaxf(d, 0.f);
  }
  p.score[int64_t(i) * p.ld + s] = acc * p.scale;
}

// One warp per token row: bf16 copy, or amax -> scale -> e4m3 (satfinite, round to nearest even).
__global__ void key_store_kernel(DsaKeyStoreParams p) {
  const int t = int(blockIdx.x) * (blockDim.x / 32) + int(threadIdx.x / 32), lane = threadIdx.x & 31;
  if (t >= p.n_tok) return;
  const DsaKeyCache& c = p.cache;
  const int Di = c.d_head, b = p.seq ? p.seq[t] : 0;
  const int64_t s = p.pos ? int64_t(p.pos[t]) : p.pos0 + t;
  uint8_t* base = const_cast<uint8_t*>(page_base(c, b, s, dsa_key_page_bytes_dev(c.fmt, c.page_size, Di)));
  const int64_t slot = s % c.page_size;
  const float* k = p.k + int64_t(t) * Di;
  if (c.fmt == DsaKeyFormat::bf16) {
    __nv_bfloat16* dst = reinterpret_cast<__nv_bfloat16*>(base + slot * 2 * Di);
    for (int e = lane; e < Di; e += 32) dst[e] = __float2bfloat16_rn(k[e]);
    return;
  }
  float amax = 0.f;
  for (int e = lane; e < Di; e += 32) amax = fmaxf(amax, fabsf(k[e]));
  amax = cuda_ops::warp_max(amax);
  const float sc = amax > 0.f ? amax / 448.f : 1.f;
  uint8_t* dst = base + slot * Di;
  for (int e = lane; e < Di; e += 32) dst[e] = __nv_cvt_float_to_fp8(k[e] / sc, __NV_SATFINITE, __NV_E4M3);
  if (lane == 0) reinterpret_cast<float*>(base + size_t(c.page_size) * Di)[slot] = sc;
}

template <int KS, int NT, int MODE, int kStages = kStagesDefault>
void launch(const DsaIndexParams& p, GpuContext& g) {
  constexpr int Di = KS * 16;
  const bool decode = p.ctx_len != nullptr;
  const size_t smem = ring_bytes(Di, MODE, kStages) + (decode ? q_bytes(NT) : 0);
  auto* kern = index_kernel<KS, NT, MODE, kStages>;
  static std::atomic<bool> sized[64] = {};  // once per device, for the larger (decode) size
  cuda_ops::smem_opt_in(sized, int(ring_bytes(Di, MODE, kStages) + q_bytes(NT)), kern);
  static std::atomic<int> per_sm[2] = {};  // resident CTAs per SM (this instantiation; prefill, decode)
  if (per_sm[decode].load() == 0) {
    int n = 0;
    K3_CUDA_ASSERT(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, kern, kThreads, smem));
    per_sm[decode] = std::max(n, 1);
  }
  const int qpc = decode ? 1 : 4;
  int64_t kpc;
  if (decode) {
    if (p.n_split > 0) {
      kpc = (p.max_ctx + p.n_split - 1) / p.n_split;
    } else {
      // whole waves of resident CTAs (a partial last wave of long CTAs would run alone): one wave while the
      // CTAs get >= 2048 keys, up to 4 waves of longer ones; CTAs of >= 256 keys
      const int64_t total = int64_t(p.n_q) * p.max_ctx,
                    slots = int64_t(cuda_ops::device_sm_count()) * per_sm[decode];
      const int64_t waves = std::clamp<int64_t>(total / (slots * 2048), 1, 4);
      const int64_t splits = std::max<int64_t>(1, slots * waves / p.n_q);  // CTAs a query, whole waves
      kpc = std::max<int64_t>(256, (p.max_ctx + splits - 1) / splits);
    }
  } else {
    kpc = 1024;
  }
  kpc = (kpc + kTileKeys - 1) / kTileKeys * kTileKeys;
  const dim3 grid(unsigned((p.max_ctx + kpc - 1) / kpc), unsigned((p.n_q + qpc - 1) / qpc));
  kern<<<grid, kThreads, smem, g.stream>>>(p, qpc, kpc);
  K3_CUDA_LAUNCH_CHECK();
}

}  // namespace

void dsa_key_store_cuda(const DsaKeyStoreParams& p, GpuContext& g) {
  K3_ASSERT(dsa_key_store_check(p).ok());
  if (p.n_tok == 0) return;
  key_store_kernel<<<unsigned((p.n_tok + 3) / 4), 128, 0, g.stream>>>(p);
  K3_CUDA_LAUNCH_CHECK();
}

void dsa_index_cuda(const DsaIndexParams& p, GpuContext& g) {
  K3_ASSERT(dsa_index_check(p).ok());
  if (p.n_q == 0) return;
  const int Di = p.cache.d_head, H = p.n_head;
  const bool f8 = p.cache.fmt == DsaKeyFormat::fp8;
  if (Di == 128 && H > 24 && H <= 32) {
    if (f8) return launch<8, 4, kFp8>(p, g);
    if (p.q_exact) return launch<8, 4, kExact>(p, g);
    if (p.stages == 6) return launch<8, 4, kBf16, 6>(p, g);
    return launch<8, 4, kBf16>(p, g);
  }
  if (Di == 16 && H <= 8 && !f8 && !p.q_exact) return launch<1, 1, kBf16>(p, g);
  index_simple_kernel<<<dim3(unsigned((p.max_ctx + 127) / 128), unsigned(p.n_q)), 128, 0, g.stream>>>(p);
  K3_CUDA_LAUNCH_CHECK();
}

}  // namespace k3
