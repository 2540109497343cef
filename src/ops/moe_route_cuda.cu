// moe_route_cuda.cu: router selection on the device (moe_route.h), one CTA per token.
//
// Keys. Each expert becomes one distinct 64-bit key whose descending order is the contract's slot order:
//   key(e) = ord(c[e]) << 32 | ~e     ord: float -> uint32 keeping the order (NaN c taken as -inf, -0 as +0)
// so a larger c comes first and equal c goes to the lower id. The row is padded with key 0 (below every
// real key: ord(-inf) > 0) to N = a power of two >= max(n_expert, 32 kItems); thread tid holds positions
// tid * kItems + r in registers (kItems = 4, or 8 above 2048 experts: N / kItems <= 512 threads).
//
// Selection: a bitonic top-K network, K = the power of two >= k. Levels 2 .. K are the bitonic sort of
// blocks of K keys (alternating direction). Each later level `size` pairs a descending block of size / 2
// with the ascending one after it, keeps the larger key of each pair at stride size / 2 in both positions
// (the top K of the two blocks' top K, as a bitonic sequence; the upper copy is never read again) and sorts
// with the merge steps K / 2 .. 1. After level N, positions 0 .. k-1 hold the top k in slot order (K = N:
// the plain bitonic sort). A step at stride j runs in registers (j < kItems), with warp shuffles (j < one
// warp's 32 kItems positions) or through shared memory (one barrier); a warp whose positions are all
// copies drops out. With K within one warp, only the log2(N / (32 kItems)) levels above a warp pay a
// barrier, run on 1/2, 1/4, ... of the warps.
//
// Weights: the owner of slot j writes sel[j] and gathers s[sel_j]; thread 0 adds the k scores in slot
// order (the reference's sum, bit for bit) and the owners write wt. Keys are exact and distinct, so the
// selection and the weights equal moe_route_ref's for every input (ties, NaN, +-inf logits) given the same
// s; s = 1 / (1 + expf(-logit)) uses CUDA's expf (max 2 ulp error), so s may differ from the host's in
// the last bit. No global scratch, no host reads, no allocation (graph-capture safe).
#include <algorithm>
#include <cmath>
#include <cstdint>

#include "ops/cuda_util.cuh"
#include "ops/moe_route.h"

namespace k3 {

namespace {

constexpr int kMaxThreads = 512;

// float -> uint32 with a < b  <=>  ord(a) < ord(b) for non-NaN floats (callers map NaN and -0 first)
__device__ __forceinline__ uint32_t ord(float c) {
  const uint32_t u = __float_as_uint(c);
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

// desc: the pair (lower position a, upper b) ends ordered a >= b; else a <= b
__device__ __forceinline__ void cmp_swap(uint64_t& a, uint64_t& b, bool desc) {
  if ((a < b) == desc) {
    const uint64_t x = a;
    a = b, b = x;
  }
}

__device__ __forceinline__ uint64_t max_u64(uint64_t a, uint64_t b) {
  return a > b ? a : b;
}

// The bitonic merge steps at strides j, j / 2, ..., 1 of merge level `size` (block b of `size` positions
// ends descending when (b & 1) == 0). key[r] is position base + r; a warp spans W = 32 kItems positions.
// Strides >= W run in place in xk (all threads, one barrier each: stale copies in dropped warps' positions
// pair only with each other there). Below W only `active` warps (warp-uniform) work. xk is striped,
// position tid * kItems + r at r * blockDim + tid, so a warp's accesses are consecutive words.
template <int kItems>
__device__ __forceinline__ void merge(uint64_t (&key)[kItems], uint64_t* xk, int base, int j, int size,
                                      bool active) {
  constexpr int W = 32 * kItems;
  const int tid = threadIdx.x, T = blockDim.x;
  if (j >= W) {
    if (active)
#pragma unroll
      for (int r = 0; r < kItems; ++r) xk[r * T + tid] = key[r];
    __syncthreads();
    for (; j >= W; j >>= 1) {
      const int jt = j / kItems;  // the partner of thread u's register r: thread u + jt, register r
#pragma unroll
      for (int q = 0; q < kItems / 2; ++q) {  // n_pad / 2 pairs, kItems / 2 per thread
        const int pr = tid + q * T, r = pr / (T / 2), h = pr % (T / 2);
        const int u = ((h & ~(jt - 1)) << 1) | (h & (jt - 1));
        uint64_t a = xk[r * T + u], b = xk[r * T + u + jt];
        cmp_swap(a, b, ((u * kItems) & size) == 0);
        xk[r * T + u] = a, xk[r * T + u + jt] = b;
      }
      __syncthreads();
    }
#pragma unroll
    for (int r = 0; r < kItems; ++r) key[r] = xk[r * T + tid];
  }
  if (!active) return;
  for (; j >= kItems; j >>= 1) {  // partner: lane ^ (j / kItems), same register
    const bool keep_max = ((base & j) == 0) == ((base & size) == 0);
#pragma unroll
    for (int r = 0; r < kItems; ++r) {
      const uint64_t o = __shfl_xor_sync(0xffffffffu, key[r], j / kItems);
      if ((o > key[r]) == keep_max) key[r] = o;  // equal keys (padding 0s) are the same either way
    }
  }
#pragma unroll
  for (int jj = kItems / 2; jj > 0; jj >>= 1)  // partner in this thread's registers
    if (jj <= j)
#pragma unroll
      for (int r = 0; r < kItems; ++r)
        if ((r & jj) == 0) cmp_swap(key[r], key[r | jj], ((base + r) & size) == 0);
}

// Both positions of each pair at stride J keep the larger key. On a descending block of J and the
// ascending block after it, this leaves the top J of the two as a bitonic sequence in each half (the
// upper half a copy of the lower one, so the upper warps drop out once J >= W).
template <int kItems>
__device__ __forceinline__ void keep_top(uint64_t (&key)[kItems], uint64_t* xk, int base, int J,
                                         bool& active) {
  constexpr int W = 32 * kItems;
  const int tid = threadIdx.x, T = blockDim.x;
  if (J >= W) {
    if (active)
#pragma unroll
      for (int r = 0; r < kItems; ++r) xk[r * T + tid] = key[r];
    __syncthreads();
    if (active && (base & J)) active = false;
    if (active)
#pragma unroll
      for (int r = 0; r < kItems; ++r) key[r] = max_u64(key[r], xk[r * T + tid + J / kItems]);
  } else if (active && J >= kItems) {
#pragma unroll
    for (int r = 0; r < kItems; ++r)
      key[r] = max_u64(key[r], __shfl_xor_sync(0xffffffffu, key[r], J / kItems));
  } else if (active) {
#pragma unroll
    for (int jj = kItems / 2; jj > 0; jj >>= 1)
      if (jj == J)
#pragma unroll
        for (int r = 0; r < kItems; ++r)
          if ((r & jj) == 0) key[r] = key[r | jj] = max_u64(key[r], key[r | jj]);
  }
}

template <int kItems>
__global__ void __launch_bounds__(kMaxThreads) route_kernel(MoeRouteParams p, int64_t ld, int n_pad) {
  extern __shared__ uint64_t smem[];
  uint64_t* xk = smem;                              // [kItems, blockDim] keys for the cross-warp steps
  float* s = reinterpret_cast<float*>(xk + n_pad);  // [E] scores
  float* s_sel = s + p.n_expert;                    // [k] selected scores, slot order; then [1] the sum
  const int tid = threadIdx.x, base = tid * kItems, E = p.n_expert, k = p.k;
  const int64_t t = blockIdx.x;
  const float* lg = p.logits + t * ld;

  uint64_t key[kItems];
#pragma unroll
  for (int r = 0; r < kItems; ++r) {
    const int e = base + r;
    key[r] = 0;
    if (e < E) {
      const float se = 1.f / (1.f + expf(-lg[e]));
      float ce = se + p.bias[e];
      ce = isnan(ce) ? -INFINITY : (ce == 0.f ? 0.f : ce);
      s[e] = se;
      key[r] = uint64_t(ord(ce)) << 32 | uint32_t(~e);
    }
  }

  // Bitonic top-K, K = the power of two >= k: levels up to K sort blocks of K keys (alternating
  // direction); each later level keeps the top K of two neighbouring blocks (keep_top) and re-sorts them
  // (merge from K / 2), so after the last level (size = n_pad, descending) positions 0 .. K-1 hold the
  // top K keys in order. With K = n_pad it is the plain bitonic sort.
  int K = 1;
  while (K < k) K <<= 1;
  bool active = true;
  for (int size = 2; size <= n_pad; size <<= 1) {
    if (size <= K) {
      merge(key, xk, base, size >> 1, size, active);
    } else {
      keep_top(key, xk, base, size >> 1, active);
      merge(key, xk, base, K >> 1, size, active);
    }
  }
  __syncthreads();  // s[] complete (a one-warp sort has no barrier)

  float s_own[kItems];
#pragma unroll
  for (int r = 0; r < kItems; ++r) {
    const int j = base + r;
    if (j < k) {
      const int e = int(~uint32_t(key[r]));
      s_own[r] = s[e];
      s_sel[j] = s_own[r];
      p.sel[t * k + j] = e;
    }
  }
  __syncthreads();
  if (tid == 0) {
    float sum = 0.f;
    for (int j = 0; j < k; ++j) sum += s_sel[j];  // slot order, as moe_route_ref
    s_sel[k] = sum;
  }
  __syncthreads();
  const float sum = s_sel[k];
#pragma unroll
  for (int r = 0; r < kItems; ++r) {
    const int j = base + r;
    if (j < k) p.wt[t * k + j] = (p.renormalize ? s_own[r] / (sum + 1e-20f) : s_own[r]) * p.scaling;
  }
}

template <int kItems>
void launch(const MoeRouteParams& p, GpuContext& g, int n_pad) {
  const size_t smem = size_t(n_pad) * sizeof(uint64_t) + size_t(p.n_expert + p.k + 1) * sizeof(float);
  if (smem > 48 * 1024)
    K3_CUDA_ASSERT(
        cudaFuncSetAttribute(route_kernel<kItems>, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
  route_kernel<kItems>
      <<<unsigned(p.n_tok), n_pad / kItems, smem, g.stream>>>(p, p.ld ? p.ld : p.n_expert, n_pad);
  K3_CUDA_LAUNCH_CHECK();
}

}  // namespace

void moe_route_cuda(const MoeRouteParams& p, GpuContext& g) {
  K3_ASSERT(moe_route_check(p).ok());
  if (p.n_tok == 0) return;
  static_assert(kMoeRouteMaxExpert <= 8 * kMaxThreads, "kItems = 8 covers every n_expert");
  int n_pad = 1;
  while (n_pad < p.n_expert) n_pad <<= 1;
  if (n_pad <= 4 * kMaxThreads)
    launch<4>(p, g, std::max(n_pad, 4 * 32));  // at least one full warp
  else
    launch<8>(p, g, n_pad);
}

}  // namespace k3
