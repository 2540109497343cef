// dsa_topk_sample_cuda.cu: the one-CTA-a-row top-k (dsa_topk.h, DsaTopkKernel::sample): a sample bound, one
// pass that keeps the keys above it, then the radix select of dsa_topk_cuda.cu over those candidates only.
//
// Row of n scores, k = topk (n > k):
//   n <= kCand: every key is a candidate (staged in shared memory, as the cluster kernel's one-CTA case).
//   else: 1. bound. S = 4096 scores at evenly spaced positions; L = the top 16 bits of the r-th largest of
//            them (two radix passes over the samples), r = ceil(S * kCand / (2 n)), so that about kCand / 2
//            keys of the row are >= L (a relative spread of ~1 / sqrt(r): r >= 16 up to 1M positions).
//         2. candidates. One read of the row: the keys >= L, with their positions, in position order into
//            shared memory (warp w takes 512 consecutive keys of each 8192-key tile, so one barrier and a
//            16-value scan a tile order the warps; the next tile's loads are in flight meanwhile).
//         3. If k <= #candidates <= kCand, the k largest keys of the row are among them (every key >= the
//            k-th largest is >= L), so the radix select (4 passes) and the ordered write run over the
//            candidates. Otherwise (a row with many equal scores, or an unlucky sample) they run over the
//            whole row in global memory: the same answer, slower.
// Cost where the bound works: one read of the row plus S sampled loads, against the cluster kernel's
// staging, four histogram passes and the write pass over every key, and no cluster barriers.
#include <algorithm>
#include <atomic>

#include "ops/cuda_util.cuh"
#include "ops/dsa_topk.h"
#include "ops/dsa_topk_cuda.cuh"

namespace k3 {
namespace topk_detail {
namespace {

constexpr int kCand = 8192;                   // candidates kept: keys and positions, 64 KB
constexpr int kSamples = 4096;                // S, 8 a thread
constexpr int kWarps = kThreads / 32;         // 16
constexpr int kPerWarp = 512;                 // consecutive keys of a tile a warp takes (16 loads a lane)
constexpr int kCandTile = kWarps * kPerWarp;  // 8192
static_assert(kSamples <= kCand, "the samples sit in the candidates' key array");

// Radix passes over keys 0 .. m-1 from bit 31 down to bit `last_shift` (one CTA, no cluster): on return,
// prefix holds the chosen digits and remaining the rank of the wanted key among those sharing them.
template <class Keys>
__device__ __forceinline__ void radix_passes(const Keys& key, int m, int last_shift, TopkShared& sh,
                                             uint32_t& prefix, uint32_t& mask, uint32_t& remaining) {
  const int tid = threadIdx.x;
  for (int shift = 24, pass = 0; shift >= last_shift; shift -= 8, ++pass) {
    uint32_t* hist = sh.hist[pass & 1];
    for (int b = tid; b < 256; b += kThreads) hist[b] = 0;
    __syncthreads();
    histogram(key, m, prefix, mask, shift, hist);
    __syncthreads();
    if (tid < 32) pick_digit(hist, remaining, tid, sh);
    __syncthreads();
    remaining -= sh.above;
    prefix |= sh.digit << shift;
    mask |= 255u << shift;
  }
}

// The k largest keys of keys 0 .. m-1 (position pos(j)) written in position order to out.
template <bool kVec, class Keys, class Pos>
__device__ __forceinline__ void select_and_write(const Keys& key, const uint4* vec, const Pos& pos, int m,
                                                 uint32_t k, TopkShared& sh, int32_t* out,
                                                 typename Scan::TempStorage& scan_tmp) {
  uint32_t prefix = 0, mask = 0, remaining = k;
  radix_passes(key, m, 0, sh, prefix, mask, remaining);
  write_selected<kVec>(key, vec, pos, m, prefix, remaining, 0u, 0u, out, scan_tmp);
}

// Step 2: appends the keys >= L of the row (n keys) to ckey / cpos in position order; returns how many there
// are (kCand + 1 past kCand, where it stops storing). Every thread returns the same count.
__device__ __forceinline__ int gather_candidates(const float* score, int n, uint32_t L, uint32_t* ckey,
                                                 int32_t* cpos, uint32_t (*cnt)[kWarps]) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  constexpr int kLoads = kPerWarp / 32;  // 16
  float cur[kLoads], nxt[kLoads];
  const int first = warp * kPerWarp + lane;  // this lane's first position in a tile
  auto load = [&](int t0, float(&v)[kLoads]) {
#pragma unroll
    for (int i = 0; i < kLoads; ++i) {
      const int j = t0 + first + 32 * i;
      v[i] = j < n ? __ldg(score + j) : 0.f;
    }
  };
  int total = 0;  // candidates so far (saturates past kCand)
  load(0, cur);
  for (int t0 = 0, tile = 0; t0 < n; t0 += kCandTile, ++tile) {
    if (t0 + kCandTile < n) load(t0 + kCandTile, nxt);
    uint32_t count = 0;
#pragma unroll
    for (int i = 0; i < kLoads; ++i)
      count += __popc(__ballot_sync(0xffffffffu, t0 + first + 32 * i < n && order_key(cur[i]) >= L));
    uint32_t(&c)[kWarps] = cnt[tile & 1];
    if (lane == 0) c[warp] = count;
    __syncthreads();  // one a tile: cnt alternates, so a warp a tile ahead writes the other buffer
    const uint32_t mine = lane < kWarps ? c[lane] : 0u;
    uint32_t incl = mine;
#pragma unroll
    for (int o = 1; o < kWarps; o <<= 1) {
      const uint32_t v = __shfl_up_sync(0xffffffffu, incl, o);
      if (lane >= o) incl += v;
    }
    int slot = total + int(__shfl_sync(0xffffffffu, incl - mine, warp));
    total = min(total + int(__shfl_sync(0xffffffffu, incl, kWarps - 1)), kCand + 1);
#pragma unroll
    for (int i = 0; i < kLoads; ++i) {
      const int j = t0 + first + 32 * i;
      const uint32_t key = order_key(cur[i]);
      const bool take = j < n && key >= L;
      const unsigned ballot = __ballot_sync(0xffffffffu, take);
      const int s = slot + __popc(ballot & ((1u << lane) - 1u));
      if (take && s < kCand) ckey[s] = key, cpos[s] = j;
      slot = min(slot + __popc(ballot), kCand);
    }
#pragma unroll
    for (int i = 0; i < kLoads; ++i) cur[i] = nxt[i];
  }
  __syncthreads();  // the candidates are visible to every thread
  return total;
}

__global__ void __launch_bounds__(kThreads, 2) topk_sample_kernel(DsaTopkParams p) {
  __shared__ TopkShared sh;
  __shared__ typename Scan::TempStorage scan_tmp;
  __shared__ uint32_t cnt[2][kWarps];
  extern __shared__ uint4 cand_u4[];  // [kCand] keys, then [kCand] positions
  uint32_t* ckey = reinterpret_cast<uint32_t*>(cand_u4);
  int32_t* cpos = reinterpret_cast<int32_t*>(ckey + kCand);
  const int row = int(blockIdx.x), tid = threadIdx.x;
  const int64_t n = p.row_len ? int64_t(p.row_len[row]) : p.len0 + row;
  int32_t* out = p.sel + int64_t(row) * p.topk;
  if (n <= p.topk) {
    for (int64_t j = tid; j < p.topk; j += kThreads) out[j] = j < n ? int32_t(j) : -1;
    return;
  }
  const float* score = p.score + int64_t(row) * p.ld;
  const uint32_t k = uint32_t(p.topk);
  if (n <= kCand) {  // every key a candidate
    const int m = int(n);
    stage_keys(score, m, ckey);
    __syncthreads();
    select_and_write<true>(
        SmemKeys{ckey}, cand_u4, [](int j) { return int32_t(j); }, m, k, sh, out, scan_tmp);
    return;
  }
  // 1. the bound: the top 16 bits of the r-th largest sample
  {
    float v[kSamples / kThreads];
#pragma unroll
    for (int u = 0; u < kSamples / kThreads; ++u) {
      const int64_t s = tid + u * kThreads;
      v[u] = __ldg(score + (2 * s + 1) * n / (2 * kSamples));
    }
#pragma unroll
    for (int u = 0; u < kSamples / kThreads; ++u) ckey[tid + u * kThreads] = order_key(v[u]);
  }
  __syncthreads();
  const int64_t r = std::min<int64_t>(kSamples, (int64_t(kSamples) * kCand / 2 + n - 1) / n);
  uint32_t prefix = 0, mask = 0, remaining = uint32_t(std::max<int64_t>(r, 1));
  radix_passes(SmemKeys{ckey}, kSamples, 16, sh, prefix, mask, remaining);
  // 2. the keys >= L (the samples' reads ended at radix_passes' last barrier)
  const int m = gather_candidates(score, int(n), prefix, ckey, cpos, cnt);
  // 3. the select over the candidates, or over the whole row
  if (m >= int(k) && m <= kCand)
    select_and_write<true>(
        SmemKeys{ckey}, cand_u4, [cpos](int j) { return cpos[j]; }, m, k, sh, out, scan_tmp);
  else
    select_and_write<false>(
        GlobalKeys{score}, nullptr, [](int j) { return int32_t(j); }, int(n), k, sh, out, scan_tmp);
}

}  // namespace

static_assert(kDsaTopkSampleMaxK * 4 <= kCand, "about kCand / 2 candidates expected, >= topk needed");

void topk_sample_launch(const DsaTopkParams& p, cudaStream_t stream) {
  constexpr size_t kSmem = size_t(kCand) * 8;
  static std::atomic<bool> attr_set[64] = {};  // the 64 KB of candidates, once per device
  int dev = 0;
  K3_CUDA_ASSERT(cudaGetDevice(&dev));
  if (dev >= 64 || !attr_set[dev].load()) {
    K3_CUDA_ASSERT(
        cudaFuncSetAttribute(topk_sample_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(kSmem)));
    if (dev < 64) attr_set[dev] = true;
  }
  topk_sample_kernel<<<unsigned(p.n_row), kThreads, kSmem, stream>>>(p);
  K3_CUDA_LAUNCH_CHECK();
}

}  // namespace topk_detail
}  // namespace k3
