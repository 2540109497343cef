// dsa_topk_cuda.cuh: internal to dsa_topk_cuda.cu and dsa_topk_sample_cuda.cu: the radix-select pieces both
// top-k kernels share (order keys, the digit histogram, the choice of a pass's digit, the ordered write of
// the selection). Not a public header.
#pragma once

#include <cub/block/block_scan.cuh>

#include <cstdint>

#include "ops/dsa_topk.h"

namespace k3::topk_detail {

constexpr int kThreads = 512;
constexpr int kItems = 8;                 // consecutive keys per thread in the compaction pass
// a write tile = threads x kItems keys <= 65535: two 16-bit counts packed in one scan value

template <int NT>
using ScanT = cub::BlockScan<uint32_t, NT>;
using Scan = ScanT<kThreads>;

// Order-preserving 32-bit key of a score (sign-flipped float bits; -0 folded to +0).
__device__ __forceinline__ uint32_t order_key(float f) {
  if (f == 0.f) f = 0.f;  // -0 ties with +0, as the float comparison says
  const uint32_t u = __float_as_uint(f);
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

struct TopkShared {
  // this CTA's histogram of pass p in hist[p % 2] (read by the cluster until pass p + 1)
  alignas(16) uint32_t hist[2][256];
  uint32_t merged[256];         // the cluster's histogram of this pass
  uint32_t lower[256];          // the part of it from the CTAs of lower rank (their chunks precede this one)
  uint32_t digit, above;        // pass result: chosen digit, merged count of keys above it
  uint32_t gt_lower, eq_lower;  // keys of the lower ranks' chunks > T (this pass), == T (the last pass)
};

// Keys j = 0 .. m-1 in shared memory (order keys), or a row of scores in global memory (converted at every
// read).
struct SmemKeys {
  const uint32_t* key;
  __device__ __forceinline__ uint32_t operator()(int j) const { return key[j]; }
};
struct GlobalKeys {
  const float* score;
  __device__ __forceinline__ uint32_t operator()(int j) const { return order_key(__ldg(score + j)); }
};

// skey[j] = order key of score[j], j < m (8 loads in flight a thread). No barrier.
template <int NT = kThreads>
__device__ __forceinline__ void stage_keys(const float* score, int m, uint32_t* skey) {
  for (int j0 = threadIdx.x; j0 < m; j0 += 8 * NT) {
    float v[8];
#pragma unroll
    for (int u = 0; u < 8; ++u) v[u] = j0 + u * NT < m ? __ldg(score + j0 + u * NT) : 0.f;
#pragma unroll
    for (int u = 0; u < 8; ++u)
      if (j0 + u * NT < m) skey[j0 + u * NT] = order_key(v[u]);
  }
}

// One histogram pass: hist[digit] += #keys k with (k & mask) == prefix. A warp takes 4 x 32 consecutive keys
// an iteration (4 independent loads a lane); a group of 32 with no key under the prefix (most of them after
// the first two passes) skips its match and atomics.
template <int NT = kThreads, class Keys>
__device__ __forceinline__ void histogram(const Keys& key, int m, uint32_t prefix, uint32_t mask, int shift,
                                          uint32_t* hist) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  for (int j0 = warp * 128; j0 < m; j0 += 4 * NT) {  // warp-uniform: every lane takes part in the match
    uint32_t bin[4];
#pragma unroll
    for (int u = 0; u < 4; ++u) {
      const int j = j0 + 32 * u + lane;
      bin[u] = 256u;
      if (j < m) {
        const uint32_t k = key(j);
        if ((k & mask) == prefix) bin[u] = (k >> shift) & 255u;
      }
    }
#pragma unroll
    for (int u = 0; u < 4; ++u) {
      if (!__any_sync(0xffffffffu, bin[u] != 256u)) continue;
      const unsigned same = __match_any_sync(0xffffffffu, bin[u]);
      if (bin[u] != 256u && lane == __ffs(same) - 1) atomicAdd(&hist[bin[u]], uint32_t(__popc(same)));
    }
  }
}

// Warp 0 (every lane): the digit d of histogram h holding the remaining-th largest key, and the count of
// keys in the digits above it, into sh.digit / sh.above (written by the one lane that finds them).
__device__ __forceinline__ void pick_digit(const uint32_t* h, uint32_t remaining, int lane, TopkShared& sh) {
  // lane l owns bins 255 - 8l .. 248 - 8l (descending); inclusive scan from the top
  uint32_t own = 0;
  for (int j = 0; j < 8; ++j) own += h[255 - 8 * lane - j];
  uint32_t incl = own;
  for (int o = 1; o < 32; o <<= 1) {
    const uint32_t v = __shfl_up_sync(0xffffffffu, incl, o);
    if (lane >= o) incl += v;
  }
  const uint32_t excl = incl - own;
  if (excl < remaining && remaining <= incl) {  // exactly one lane
    uint32_t above = excl;
    int d = 255 - 8 * lane;
    while (above + h[d] < remaining) above += h[d--];
    sh.digit = uint32_t(d), sh.above = above;
  }
}

// The ordered write of the selection among keys j = 0 .. m-1 (position pos(j)), given T (the topk-th
// largest key), need (how many keys == T to take) and the counts of selected keys before this CTA's first
// (gt_before: > T, eq_before: == T): key j goes to out[#greater before j + min(#equal before j, need)] if
// key > T, or key == T and fewer than need equal keys precede it. kVec: the keys are also `vec`, 16-byte
// vectors in shared memory (read twice, not kept across the scan); else read once through key. Ends with a
// barrier.
template <bool kVec, int NT = kThreads, class Keys, class Pos>
__device__ __forceinline__ void write_selected(const Keys& key, const uint4* vec, const Pos& pos, int m,
                                               uint32_t T, uint32_t need, uint32_t gt_before,
                                               uint32_t eq_before, int32_t* out,
                                               typename ScanT<NT>::TempStorage& scan_tmp) {
  constexpr int kTile = NT * kItems;
  const int tid = threadIdx.x;
  for (int t0 = 0; t0 < m; t0 += kTile) {
    const int j0 = t0 + tid * kItems;
    uint32_t k[kItems], packed = 0;
    if (kVec && j0 + kItems <= m) {  // two 16-byte reads (j0 is a multiple of 8)
      const uint4 a = vec[j0 / 4], b = vec[j0 / 4 + 1];
      k[0] = a.x, k[1] = a.y, k[2] = a.z, k[3] = a.w, k[4] = b.x, k[5] = b.y, k[6] = b.z, k[7] = b.w;
    } else {
#pragma unroll
      for (int j = 0; j < kItems; ++j) k[j] = j0 + j < m ? key(j0 + j) : 0u;
    }
#pragma unroll
    for (int j = 0; j < kItems; ++j) {
      packed += (j0 + j < m && k[j] > T) ? 1u : 0u;
      packed += (j0 + j < m && k[j] == T) ? 0x10000u : 0u;
    }
    uint32_t excl, total;
    ScanT<NT>(scan_tmp).ExclusiveSum(packed, excl, total);
    uint32_t gt = gt_before + (excl & 0xFFFFu), eq = eq_before + (excl >> 16);
#pragma unroll
    for (int j = 0; j < kItems; ++j) {
      if (j0 + j >= m) break;
      const int32_t p = pos(j0 + j);
      const uint32_t kj = kVec ? key(j0 + j) : k[j];
      if (kj > T) {
        out[gt + min(eq, need)] = p;
        ++gt;
      } else if (kj == T) {
        if (eq < need) out[gt + eq] = p;
        ++eq;
      }
    }
    gt_before += total & 0xFFFFu, eq_before += total >> 16;
    __syncthreads();  // scan_tmp reuse
  }
}

// The one-CTA-a-row sample-select kernel (dsa_topk_sample_cuda.cu), asynchronous on stream; needs
// p.topk <= kDsaTopkSampleMaxK.
void topk_sample_launch(const DsaTopkParams& p, cudaStream_t stream);

}  // namespace k3::topk_detail
