// dsa_topk_cuda.cu: exact causal top-k of the DSA index scores by radix select (dsa_topk.h).
//
// Grid: n_row clusters of C CTAs (cluster dims (C, 1, 1)); CTA r of a row owns the contiguous chunk
// [r * chunk, min(n, (r + 1) * chunk)). A chunk of up to kStageKeys keys is first copied into shared memory
// as order keys (one coalesced read of the row, converted once), so the passes below read shared memory;
// longer chunks (rows past kStageKeys * C) read global memory in every pass (a second instantiation, 2 CTAs
// an SM instead of 3). Per pass (digit 3 .. 0 of the 32-bit key, 8 bits each):
//   local histogram of the digit over the keys that match the prefix found so far (a warp takes 4 groups of
//   32 keys at a time; a group with a key under the prefix aggregates equal digits with one match and one
//   smem atomic a digit, a group without one, most of them after two passes, costs a vote), one barrier
//   (the cluster's, release / acquire, where C > 1: a GPU-scope fence each, so the only ones), every CTA
//   sums the C histograms through distributed shared memory (and, apart, those of the lower ranks), warp 0
//   finds the digit b* holding the remaining-th largest key and adds b* to the prefix. Histograms alternate
//   between two buffers, so no second barrier guards their reuse.
// After 4 passes the prefix is T, the topk-th largest key; need = how many keys == T to take; the lower
// ranks' counts of keys > T (the sum over passes of their keys above each pass's digit) and == T (their last
// histogram at T) came with the merges. Every CTA writes its selected positions in order with a block scan:
// slot(s) = #greater before s + min(#equal before s, need). A relaxed cluster arrive after the last merge
// and a wait at the end keep every CTA's histograms alive while peers read them.
// kPush (the default since session 20 where the exchange fits beside the keys; K3_DSA_TOPK_PUSH=0: off):
// the histograms travel the other way, without cluster barriers: each CTA st.asyncs its histogram into
// every CTA's receive buffer, counted on an mbarrier there (Exchange below), and sums them from its own
// shared memory. H100, session 20: b1 8K / 32K / 128K 12.6 / 15.5 / 22.3 -> 11.1 / 12.5 / 20.1 us. Where
// the rows are few and long (chunks >= 4096 keys, every row's cluster resident at once) the CTAs have 1024
// threads, one an SM: b1 x 128K 18.95 -> 16.88 us (K3_DSA_TOPK_WIDE=0 / 1: never / wherever they fit).
#include <cooperative_groups.h>

#include <algorithm>
#include <atomic>
#include <string>

#include "core/env.h"
#include "ops/cuda_mma.cuh"
#include "ops/cuda_util.cuh"
#include "ops/dsa_topk.h"
#include "ops/dsa_topk_cuda.cuh"

namespace k3 {
namespace {

namespace cg = cooperative_groups;
using namespace topk_detail;

constexpr int64_t kMinKeysPerCta = 2048;  // the automatic cluster size splits rows no finer than this
constexpr int kResidentPerSm = 3;         // staged kernel's CTAs an SM (40 registers, 512 threads, 64 KB)
constexpr int64_t kKeysPerCta = 8192;     // the earlier rule (K3_DSA_TOPK_FILL=0): ceil(max_len / this)
constexpr int64_t kSampleMinLen = 16384;  // the automatic choice takes the sample kernel above this length
constexpr int kMaxCluster = 16;           // non-portable above 8: checked once per device, else 8
constexpr int kStageKeys = 16384;         // a CTA's chunk up to this long is staged in shared memory (64 KB)
constexpr size_t kPushSmem = 68 * 1024;   // staged keys + exchange up to this keep 3 CTAs an SM (228 KB)
constexpr int64_t kWideMinChunk = 4096;   // 1024-thread CTAs (one an SM) for chunks at least this long
__device__ __forceinline__ void cluster_arrive_relaxed() {
  asm volatile("barrier.cluster.arrive.relaxed.aligned;\n" ::: "memory");
}
__device__ __forceinline__ void cluster_wait() {
  asm volatile("barrier.cluster.wait.aligned;\n" ::: "memory");
}

// kPush: the cluster's exchange without cluster barriers. Each CTA stores its pass histogram into every
// CTA's recv[pass % 2][rank] by st.async (distributed shared memory), counted in bytes on the receiver's
// mbarrier bar[pass % 2], which the receiver armed (one arrival, C KB expected) at the start of the pass; a
// store that lands before the arming only takes the count below zero, and the phase cannot complete before
// the arrival. A CTA reaches pass p + 2 (the same buffer) only after every CTA's pass p + 1 histogram, sent
// after its pass p merge, so no store overwrites a buffer still being read. No fence: the receiver's acquire
// wait orders the data.
struct Exchange {
  uint32_t* recv;   // [2][C][256]
  uint64_t* bar;    // [2]: one a buffer
};

// The 4 radix passes of the cluster over this CTA's keys 0 .. m-1: on return prefix holds T, remaining the
// number of keys == T to take, gt_lower the lower ranks' keys > T, sh.eq_lower their keys == T. Without
// kPush the last merge arrives on the cluster barrier the kernel's end waits on.
template <bool kPush, int NT, class Keys>
__device__ __forceinline__ void cluster_passes(cg::cluster_group& cluster, int C, int rank, const Keys& key,
                                               int m, TopkShared& sh, const Exchange& x, uint32_t& prefix,
                                               uint32_t& mask, uint32_t& remaining, uint32_t& gt_lower) {
  const int tid = threadIdx.x, warp = tid >> 5;
  for (int shift = 24, pass = 0; shift >= 0; shift -= 8, ++pass) {
    uint32_t* hist = sh.hist[pass & 1];
    for (int b = tid; b < 256; b += NT) hist[b] = 0;
    const uint32_t bar = kPush ? smem_addr(&x.bar[pass & 1]) : 0u;
    if (kPush && C > 1 && tid == 0) mbar_expect_tx(bar, uint32_t(C) * 1024u);
    __syncthreads();
    histogram<NT>(key, m, prefix, mask, shift, hist);
    const uint32_t* recv = kPush ? x.recv + (pass & 1) * C * 256 : nullptr;
    if (kPush && C > 1) {
      __syncthreads();  // this CTA's histogram is complete
      const uint32_t slot = smem_addr(recv + rank * 256);
      for (int i = tid; i < C * 64; i += NT)  // 64 16-byte pieces to each CTA
        st_async(slot + 16u * uint32_t(i & 63), bar, uint32_t(i >> 6),
                 reinterpret_cast<const uint4*>(hist)[i & 63]);
      mbar_wait_parity<true>(bar, uint32_t(pass >> 1) & 1u);
    } else if (C > 1) {
      cluster.sync();
    } else {
      __syncthreads();
    }
    for (int b = tid; b < 256; b += NT) {
      uint32_t s = 0, low = 0;
      for (int r = 0; r < C; ++r) {
        const uint32_t v = C == 1 ? hist[b] : kPush ? recv[r * 256 + b] : cluster.map_shared_rank(hist, r)[b];
        s += v;
        low += r < rank ? v : 0u;
      }
      sh.merged[b] = s, sh.lower[b] = low;
    }
    if (!kPush && C > 1 && shift == 0) cluster_arrive_relaxed();  // the last remote reads are done
    __syncthreads();
    if (warp == 0) {
      const int lane = tid & 31;
      pick_digit(sh.merged, remaining, lane, sh);
      __syncwarp();
      const uint32_t d = sh.digit;
      uint32_t gl = 0;  // the lower ranks' keys above the digit
      for (int j = 0; j < 8; ++j) {
        const int b = 255 - 8 * lane - j;
        if (uint32_t(b) > d) gl += sh.lower[b];
      }
      for (int o = 16; o > 0; o >>= 1) gl += __shfl_xor_sync(0xffffffffu, gl, o);
      if (lane == 0) {
        sh.gt_lower = gl;
        if (shift == 0) sh.eq_lower = sh.lower[d];
      }
    }
    __syncthreads();
    remaining -= sh.above;
    prefix |= sh.digit << shift;
    mask |= 255u << shift;
    gt_lower += sh.gt_lower;
  }
}

// Dynamic shared memory: kStaged: ceil(max_len / C) order keys; then, with kPush, the Exchange (recv, bar).
__host__ __device__ constexpr size_t keys_bytes(bool staged, int64_t max_len, int C) {
  return staged ? size_t((max_len + C - 1) / C * 4 + 15) / 16 * 16 : 0;
}
__host__ __device__ constexpr size_t exchange_bytes(int C) {
  return size_t(2 * C * 256) * 4 + 2 * 8;
}

// NT threads a CTA: 512 (3 CTAs an SM staged, 2 not), or 1024 (staged, one CTA an SM) where every row's
// cluster is resident at once (dsa_topk_cuda's `wide`).
template <bool kStaged, bool kPush, int NT>
__global__ void __launch_bounds__(NT, NT > 512  ? 1
                                      : kStaged ? 3
                                                : 2) topk_kernel(DsaTopkParams p) {
  cg::cluster_group cluster = cg::this_cluster();
  const int C = int(cluster.num_blocks()), rank = int(cluster.block_rank());
  const int row = int(blockIdx.x) / C;
  __shared__ TopkShared sh;
  __shared__ typename ScanT<NT>::TempStorage scan_tmp;
  extern __shared__ uint4 staged_u4[];  // kStaged: [chunk] order keys; kPush: then the Exchange
  const int tid = threadIdx.x;
  const int64_t n = p.row_len ? int64_t(p.row_len[row]) : p.len0 + row;
  int32_t* out = p.sel + int64_t(row) * p.topk;
  if (n <= p.topk) {  // the same decision in every CTA of the cluster: nobody touches remote memory
    for (int64_t j = int64_t(rank) * NT + tid; j < p.topk; j += int64_t(C) * NT)
      out[j] = j < n ? int32_t(j) : -1;
    return;
  }
  Exchange x = {};
  if constexpr (kPush) {
    char* base = reinterpret_cast<char*>(staged_u4) + keys_bytes(kStaged, p.max_len, C);
    x.recv = reinterpret_cast<uint32_t*>(base);
    x.bar = reinterpret_cast<uint64_t*>(base + size_t(2 * C * 256) * 4);
    if (C > 1) {
      if (tid == 0) {  // each mbarrier: one arrival a phase (each pass arms its own as it starts)
        mbar_init(smem_addr(&x.bar[0]), 1);
        mbar_init(smem_addr(&x.bar[1]), 1);
        fence_mbar_init();
      }
      cluster_arrive_relaxed();  // waited on below, before the first store into a peer
    }
  }
  const int64_t chunk = (n + C - 1) / C;
  const int64_t lo = std::min<int64_t>(n, rank * chunk), hi = std::min<int64_t>(n, lo + chunk);
  const int m = int(hi - lo);                               // n < 2^31 (row_len is int32)
  const float* score = p.score + int64_t(row) * p.ld + lo;  // score[j] = score of position lo + j
  uint32_t* skey = reinterpret_cast<uint32_t*>(staged_u4);
  if constexpr (kStaged) stage_keys<NT>(score, m, skey);
  const auto key = [&] {
    if constexpr (kStaged)
      return SmemKeys{skey};
    else
      return GlobalKeys{score};
  }();
  if (kPush && C > 1) cluster_wait();  // every CTA's mbarriers are set

  uint32_t prefix = 0, mask = 0, remaining = uint32_t(p.topk), gt_lower = 0;
  cluster_passes<kPush, NT>(cluster, C, rank, key, m, sh, x, prefix, mask, remaining, gt_lower);
  const uint32_t T = prefix, need = remaining;

  const auto pos = [lo](int j) { return int32_t(lo + j); };
  write_selected<kStaged, NT>(key, staged_u4, pos, m, T, need, gt_lower, sh.eq_lower, out, scan_tmp);
  // Without kPush no CTA exits while a peer may still read its histograms. With it every store into a CTA
  // is counted by an mbarrier the CTA waits on before it goes on.
  if (!kPush && C > 1) cluster_wait();
}

cudaLaunchConfig_t launch_config(int C, const DsaTopkParams& p, size_t smem, cudaStream_t stream,
                                 cudaLaunchAttribute* attr, int threads = kThreads) {
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3(unsigned(p.n_row) * unsigned(C));
  cfg.blockDim = dim3(unsigned(threads));
  cfg.dynamicSmemBytes = smem;
  cfg.stream = stream;
  attr[0].id = cudaLaunchAttributeClusterDimension;
  attr[0].val.clusterDim.x = unsigned(C), attr[0].val.clusterDim.y = 1, attr[0].val.clusterDim.z = 1;
  cfg.attrs = attr, cfg.numAttrs = 1;
  return cfg;
}

using TopkKernel = void (*)(DsaTopkParams);

// wide: 1024 threads (staged chunks only; the unstaged kernel needs its 64 registers at 512)
TopkKernel topk_kernel_for(bool staged, bool push, bool wide) {
  if (staged && wide) return push ? topk_kernel<true, true, 1024> : topk_kernel<true, false, 1024>;
  if (staged) return push ? topk_kernel<true, true, kThreads> : topk_kernel<true, false, kThreads>;
  return push ? topk_kernel<false, true, kThreads> : topk_kernel<false, false, kThreads>;
}

// The largest cluster this device runs (16 where the non-portable size fits, else 8); the kernels'
// attributes (64 KB of staged keys and exchange, non-portable clusters) are set on the way, once per device.
int max_cluster() {
  static std::atomic<int> known[64] = {};
  int dev = 0;
  K3_CUDA_ASSERT(cudaGetDevice(&dev));
  if (dev < 64 && known[dev].load() > 0) return known[dev].load();
  bool non_portable = true;
  for (int k = 0; k < 6; ++k) {
    const bool staged = k < 4, push = k % 2, wide = k >= 2 && k < 4;
    const TopkKernel f = topk_kernel_for(staged, push, wide);
    const size_t smem = staged ? (push ? kPushSmem : kStageKeys * sizeof(uint32_t))
                        : push ? exchange_bytes(kMaxCluster)
                               : 0;
    if (smem > 0)
      K3_CUDA_ASSERT(cudaFuncSetAttribute(f, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
    non_portable = non_portable &&
                   cudaFuncSetAttribute(f, cudaFuncAttributeNonPortableClusterSizeAllowed, 1) == cudaSuccess;
  }
  int best = 8;
  if (non_portable) {
    DsaTopkParams one;
    one.n_row = 1;
    cudaLaunchAttribute attr[1];
    const cudaLaunchConfig_t cfg =
        launch_config(kMaxCluster, one, kStageKeys * sizeof(uint32_t), nullptr, attr);
    int clusters = 0;
    if (cudaOccupancyMaxActiveClusters(&clusters, topk_kernel<true, false, kThreads>, &cfg) == cudaSuccess &&
        clusters > 0)
      best = kMaxCluster;
  }
  (void)cudaGetLastError();  // a refused query leaves no sticky error; clear the last one
  if (dev < 64) known[dev] = best;
  return best;
}

// Clusters of C wide (1024-thread, staged, pushed) CTAs the device runs at once, with the most shared memory
// they take (0: none; a 16-CTA cluster needs 16 SMs of one GPC), once per device and C.
int wide_clusters(int C) {
  static std::atomic<int> known[64][kMaxCluster + 1] = {};  // clusters + 1; 0: not asked yet
  int dev = 0;
  K3_CUDA_ASSERT(cudaGetDevice(&dev));
  if (dev < 64 && known[dev][C].load() > 0) return known[dev][C].load() - 1;
  DsaTopkParams one;
  one.n_row = 1;
  cudaLaunchAttribute attr[1];
  const cudaLaunchConfig_t cfg = launch_config(C, one, kPushSmem, nullptr, attr, 1024);
  int clusters = 0;
  if (cudaOccupancyMaxActiveClusters(&clusters, topk_kernel<true, true, 1024>, &cfg) != cudaSuccess)
    clusters = 0;
  (void)cudaGetLastError();
  if (dev < 64) known[dev][C] = clusters + 1;
  return clusters;
}

// CTAs per row when the caller leaves it open: as many as fill the resident slots of one wave
// (kResidentPerSm x SMs over the rows), a power of two, no finer than kMinKeysPerCta keys a CTA, and at
// least enough that a chunk fits the staged kernel. Chosen from forced counts timed on an H100 (session 18,
// bench_dsa *_topk_cN_us): best at b1 8K / 32K / 128K = 4 / 8-16 / 16, at b64 = 2-4 / 4 / 8. The default
// since session 19 (H100, same run as the earlier rule ceil(max_len / 8192), K3_DSA_TOPK_FILL=0): b1 8K /
// 32K / 128K 18.8 / 20.7 / 22.4 -> 12.6 / 15.7 / 22.6 us, b64 8K / 128K 20.4 / 114 -> 17.1 / 94.5; test-ops
// and bench_dsa's set checks pass with it.
int auto_cluster(const DsaTopkParams& p, int c_max) {
  static const bool fill_rule = env_switch("K3_DSA_TOPK_FILL", true);
  if (!fill_rule) return int(std::clamp<int64_t>((p.max_len + kKeysPerCta - 1) / kKeysPerCta, 1, c_max));
  const int64_t fill = std::max<int64_t>(1, int64_t(kResidentPerSm) * cuda_ops::device_sm_count() / p.n_row);
  const int64_t fine = (p.max_len + kMinKeysPerCta - 1) / kMinKeysPerCta;
  int64_t c = 1;
  while (2 * c <= std::min(fill, fine)) c *= 2;
  c = std::max(c, (p.max_len + kStageKeys - 1) / kStageKeys);
  return int(std::clamp<int64_t>(c, 1, c_max));
}

}  // namespace

void dsa_topk_cuda(const DsaTopkParams& p, GpuContext& g) {
  K3_ASSERT(dsa_topk_check(p).ok());
  if (p.n_row == 0) return;
  // The automatic choice (H100, session 19, bench_dsa): the sample kernel where the rows alone fill a
  // quarter of the SMs and are longer than kSampleMinLen (b64 x 32K / 128K: 32.2 / 94.5 -> 29.7 / 54.9 us),
  // the cluster kernel elsewhere (b1: one CTA reading 128K keys takes 47 us, 16 CTAs 22.6; b64 x 8K: 17.1
  // against 18.2). K3_DSA_TOPK_SAMPLE=1 / 0: the sample kernel always / never. K3_DSA_TOPK_PUSH=0 (read per
  // call): the cluster kernel's histograms exchanged by cluster barriers and remote loads instead.
  static const int sample_env = env_value("K3_DSA_TOPK_SAMPLE").empty()   ? -1
                                : env_switch("K3_DSA_TOPK_SAMPLE", false) ? 1
                                                                          : 0;
  const bool rows_fill = int64_t(p.n_row) * 4 >= cuda_ops::device_sm_count() && p.max_len > kSampleMinLen;
  const bool sample = p.kernel == DsaTopkKernel::sample ||
                      (p.kernel == DsaTopkKernel::automatic && p.cluster == 0 &&
                       p.topk <= kDsaTopkSampleMaxK && (sample_env == 1 || (sample_env == -1 && rows_fill)));
  if (sample) {
    topk_sample_launch(p, g.stream);
    return;
  }
  const int c_max = max_cluster();
  const int C = p.cluster > 0 ? std::min(p.cluster, c_max) : auto_cluster(p, c_max);
  const int64_t chunk = (p.max_len + C - 1) / C;  // the longest chunk of any row
  const bool staged = chunk <= kStageKeys;
  // kPush where keys and exchange keep 3 CTAs an SM (not b64 x 128K at 8 CTAs a row: 96 -> 104 us), or on
  // unstaged chunks
  const size_t keys = keys_bytes(staged, p.max_len, C);
  const bool push =
      C > 1 && env_switch("K3_DSA_TOPK_PUSH", true) && (!staged || keys + exchange_bytes(C) <= kPushSmem);
  // 1024 threads a CTA (one an SM) for staged chunks of >= 4096 keys where every row's cluster runs at once
  // (K3_DSA_TOPK_WIDE=0 / 1, read per call: never / wherever the clusters all run at once)
  const std::string wide_env = env_value("K3_DSA_TOPK_WIDE");
  const bool want_wide = wide_env.empty() ? chunk >= kWideMinChunk : env_switch("K3_DSA_TOPK_WIDE", false);
  const bool wide = want_wide && C > 1 && staged && p.n_row <= wide_clusters(C);
  cudaLaunchAttribute attr[1];
  const cudaLaunchConfig_t cfg =
      launch_config(C, p, keys + (push ? exchange_bytes(C) : 0), g.stream, attr, wide ? 1024 : kThreads);
  K3_CUDA_ASSERT(cudaLaunchKernelEx(&cfg, topk_kernel_for(staged, push, wide), p));
}

}  // namespace k3
