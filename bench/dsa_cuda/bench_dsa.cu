// bench_dsa.cu: DSA decode on one GPU: index scores, top-2048 and sparse MLA (ops/dsa_index.h, dsa_topk.h,
// mla_sparse.h), and the FP8 index keys' accuracy against bf16.
//
//   bench_dsa [OUT.jsonl] [COMMIT] [profile]   (profile: only a few indexer and top-k launches, for ncu)
// 1. copy bandwidth: cudaMemcpy D2D of 2 GiB (read + write bytes / time): the ceiling of every byte floor.
// 2. checks on the timed data: the batch-1 128K index scores against the fp64 reference (NMSE), GPU top-k of
//    those scores against the reference top-k (exact set), sparse MLA heads against the reference.
// 3. timing (graph_us: 16 calls in one CUDA graph, as in the decode step's graph; median of 11), K3.1
//    shapes (32 x 128 indexer, topk 2048, 96 heads, P = 64, shuffled pages): indexer at 128K for batch 1
//    and 64 (bf16 and fp8 keys; batch 1 rotates over 64 sequences so L2 never holds the keys) against its
//    byte floor; top-k and sparse MLA at 8K, 32K, 128K,
//    and their sum against the 8K sum (the "flat in context" goal). `*_eager_us`: one launch between two
//    events (median of 15), which also counts the host's launch work while the GPU waits.
// 4. FP8 accuracy: top-2048 overlap and score NMSE of fp8 against bf16 keys, on random keys and on structured
//    ones (outlier channels, low rank, queries aligned with some keys), batch 8 x 32K.
// Build: bash bench/dsa_cuda/build.sh.
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "../cuda_bench_util.cuh"
#include "core/dtype.h"
#include "ops/dsa_index.h"
#include "ops/dsa_topk.h"
#include "ops/mla_decode.h"
#include "ops/mla_sparse.h"

using namespace k3;

namespace {

constexpr int kH = 32, kDi = 128, kTopk = 2048, kP = 64, kHeads = 96;

__device__ uint64_t mix(uint64_t i, uint64_t seed) {
  uint64_t h = (i + 1) * 0x9E3779B97F4A7C15ull ^ seed;
  h ^= h >> 31, h *= 0xBF58476D1CE4E5B9ull, h ^= h >> 29;
  return h;
}
__device__ float unif(uint64_t i, uint64_t seed) {
  return float(mix(i, seed) >> 40) * (1.f / 16777216.f);
}

// uniform(-a, a) as bf16 (kind 0); structured (kind 1): a few outlier channels x8, a shared low-rank part
__global__ void fill_bf16(uint16_t* x, size_t n, int width, float a, int kind, uint64_t seed) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    float u = (unif(i, seed) * 2.f - 1.f) * a;
    if (kind == 1) {
      const int e = int(i % width);
      const size_t row = i / width;
      const float z = unif(row, seed ^ 0x55) * 2.f - 1.f;  // per-row latent factor
      u = 0.35f * u + z * __sinf(0.37f * float(e)) * a;
      if (e % 41 == 3) u *= 8.f;
    }
    const uint32_t b = __float_as_uint(u);
    x[i] = uint16_t((b + 0x7FFFu + ((b >> 16) & 1u)) >> 16);
  }
}
__global__ void fill_f32(float* x, size_t n, float a, uint64_t seed) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x)
    x[i] = (unif(i, seed) * 2.f - 1.f) * a;
}
__global__ void bf16_to_f32_k(float* y, const uint16_t* x, size_t n) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x)
    y[i] = __uint_as_float(uint32_t(x[i]) << 16);
}

template <class F>
double median_us(GpuContext& g, F&& f, int iters = 15) {
  cudaEvent_t a, b;
  CK(cudaEventCreate(&a));
  CK(cudaEventCreate(&b));
  for (int i = 0; i < 3; ++i) f(i);
  std::vector<float> ms;
  for (int i = 0; i < iters; ++i) {
    CK(cudaEventRecord(a, g.stream));
    f(i);
    CK(cudaEventRecord(b, g.stream));
    CK(cudaEventSynchronize(b));
    float t = 0;
    CK(cudaEventElapsedTime(&t, a, b));
    ms.push_back(t);
  }
  CK(cudaGetLastError());
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2] * 1e3;
}

double nmse(const std::vector<float>& y, const std::vector<float>& r) {
  double num = 0, den = 0;
  for (size_t i = 0; i < r.size(); ++i)
    num += (double(y[i]) - r[i]) * (double(y[i]) - r[i]), den += double(r[i]) * r[i];
  return den > 0 ? num / den : num;
}

// A paged cache of n_seq sequences x ctx tokens, pages of each sequence shuffled over the pool.
struct Pool {
  int n_seq = 0, ctx = 0, max_pages = 0;
  int64_t n_pages = 0;
  std::vector<int32_t> table;
  int32_t* d_table = nullptr;
};
Pool make_pool(int n_seq, int ctx, uint64_t seed) {
  Pool p;
  p.n_seq = n_seq, p.ctx = ctx, p.max_pages = (ctx + kP - 1) / kP, p.n_pages = int64_t(n_seq) * p.max_pages;
  std::vector<int32_t> perm(size_t(p.n_pages));
  std::iota(perm.begin(), perm.end(), 0);
  std::shuffle(perm.begin(), perm.end(), std::mt19937_64(seed));
  p.table = perm;
  CK(cudaMalloc(&p.d_table, p.table.size() * 4));
  CK(cudaMemcpy(p.d_table, p.table.data(), p.table.size() * 4, cudaMemcpyHostToDevice));
  return p;
}

// Index keys of a pool in both formats (bf16 pages and fp8 pages made by the store op from the same values).
struct Keys {
  void* bf16 = nullptr;
  void* fp8 = nullptr;
};
Keys make_keys(GpuContext& g, const Pool& pool, int kind, uint64_t seed) {
  Keys k;
  const size_t n = size_t(pool.n_pages) * kP * kDi;
  CK(cudaMalloc(&k.bf16, n * 2));
  CK(cudaMalloc(&k.fp8, size_t(pool.n_pages) * dsa_key_page_bytes(DsaKeyFormat::fp8, kP, kDi)));
  fill_bf16<<<4096, 256, 0, g.stream>>>(static_cast<uint16_t*>(k.bf16), n, kDi, 1.7f, kind, seed);
  // fp8 pages: every token's bf16 row (as fp32) through dsa_key_store_cuda, in chunks
  const int chunk = 1 << 20;
  float* rows;
  int32_t *seq, *pos;
  CK(cudaMalloc(&rows, size_t(chunk) * kDi * 4));
  CK(cudaMalloc(&seq, size_t(chunk) * 4));
  CK(cudaMalloc(&pos, size_t(chunk) * 4));
  std::vector<int32_t> hs(chunk), hp(chunk);
  std::vector<int64_t> inv(size_t(pool.n_pages));  // pool page -> b * max_pages + page index
  for (int64_t i = 0; i < int64_t(pool.table.size()); ++i) inv[size_t(pool.table[size_t(i)])] = i;
  // token (b, s) lives at page table[b, s / P], slot s % P: feed rows in page order so the copy is linear
  const int64_t total = pool.n_pages * kP;
  for (int64_t t0 = 0; t0 < total; t0 += chunk) {
    const int m = int(std::min<int64_t>(chunk, total - t0));
    for (int j = 0; j < m; ++j) {
      const int64_t t = t0 + j, page = t / kP, idx = inv[size_t(page)];
      hs[j] = int32_t(idx / pool.max_pages), hp[j] = int32_t((idx % pool.max_pages) * kP + t % kP);
    }
    CK(cudaMemcpyAsync(seq, hs.data(), size_t(m) * 4, cudaMemcpyHostToDevice, g.stream));
    CK(cudaMemcpyAsync(pos, hp.data(), size_t(m) * 4, cudaMemcpyHostToDevice, g.stream));
    bf16_to_f32_k<<<1024, 256, 0, g.stream>>>(rows, static_cast<uint16_t*>(k.bf16) + size_t(t0) * kDi,
                                              size_t(m) * kDi);
    DsaKeyStoreParams s;
    s.cache.fmt = DsaKeyFormat::fp8, s.cache.d_head = kDi, s.cache.page_size = kP,
    s.cache.max_pages = pool.max_pages;
    s.cache.n_pages = pool.n_pages, s.cache.pages = k.fp8, s.cache.block_table = pool.d_table;
    s.n_tok = m, s.k = rows, s.seq = seq, s.pos = pos;
    dsa_key_store_cuda(s, g);
    CK(cudaStreamSynchronize(g.stream));
  }
  CK(cudaFree(rows));
  CK(cudaFree(seq));
  CK(cudaFree(pos));
  return k;
}

DsaIndexParams index_params(const Pool& pool, void* pages, DsaKeyFormat fmt, int n_q, const int32_t* lens,
                            const float* q, const float* w, float* score, int64_t ld) {
  DsaIndexParams p;
  p.cache.fmt = fmt, p.cache.d_head = kDi, p.cache.page_size = kP, p.cache.max_pages = pool.max_pages;
  p.cache.n_pages = pool.n_pages, p.cache.pages = pages, p.cache.block_table = pool.d_table;
  p.n_head = kH, p.n_q = n_q, p.ctx_len = lens, p.max_ctx = pool.ctx, p.q = q, p.w = w;
  p.scale = 1.f / std::sqrt(float(kH * kDi)), p.score = score, p.ld = ld;
  return p;
}

// Host copy of sequence b's first n tokens' key pages as a one-sequence pool (pages 0..), for the references.
struct HostKeys {
  std::vector<uint8_t> pages;
  std::vector<int32_t> table;
};
HostKeys host_keys(const Pool& pool, const void* dev_pages, DsaKeyFormat fmt, int b, int n) {
  HostKeys h;
  const size_t pb = dsa_key_page_bytes(fmt, kP, kDi);
  const int np = (n + kP - 1) / kP;
  h.pages.resize(size_t(np) * pb);
  h.table.resize(size_t(np));
  for (int j = 0; j < np; ++j) {
    h.table[size_t(j)] = j;
    const int32_t page = pool.table[size_t(b) * pool.max_pages + size_t(j)];
    CK(cudaMemcpy(h.pages.data() + size_t(j) * pb, static_cast<const uint8_t*>(dev_pages) + size_t(page) * pb,
                  pb, cudaMemcpyDeviceToHost));
  }
  return h;
}

std::vector<float> down(const float* d, size_t n) {
  std::vector<float> h(n);
  CK(cudaMemcpy(h.data(), d, n * 4, cudaMemcpyDeviceToHost));
  return h;
}
std::vector<int32_t> down_i(const int32_t* d, size_t n) {
  std::vector<int32_t> h(n);
  CK(cudaMemcpy(h.data(), d, n * 4, cudaMemcpyDeviceToHost));
  return h;
}

void check(bool ok, const std::string& what) {
  std::printf("check %-60s %s\n", what.c_str(), ok ? "OK" : "FAILED");
  if (!ok) ++g_fail;
}

}  // namespace

int main(int argc, char** argv) {
  g_bench = "dsa_cuda";
  if (argc > 1) g_out = argv[1];
  if (argc > 2) g_commit = argv[2];
  cudaDeviceProp prop;
  CK(cudaGetDeviceProperties(&prop, 0));
  g_machine = prop.name;
  std::printf("device %s, %d SMs\n", prop.name, prop.multiProcessorCount);
  GpuContext g;
  CK(cudaStreamCreate(&g.stream));
  g.workspace_bytes = size_t(512) << 20;
  CK(cudaMalloc(&g.workspace, g.workspace_bytes));
  const bool profile = argc > 3 && std::string(argv[3]) == "profile";
  const double copy = profile ? 0.0 : copy_bandwidth(g);

  const int B = 64, kMax = 131072;
  Pool pool = make_pool(B, kMax, 1);
  Keys keys = make_keys(g, pool, 0, 11);
  float *q, *w, *score;
  int32_t *sel, *lens;
  CK(cudaMalloc(&q, size_t(B) * kH * kDi * 4));
  CK(cudaMalloc(&w, size_t(B) * kH * 4));
  CK(cudaMalloc(&score, size_t(B) * kMax * 4));
  CK(cudaMalloc(&sel, size_t(B) * kTopk * 4));
  CK(cudaMalloc(&lens, size_t(B) * 4));
  fill_f32<<<256, 256, 0, g.stream>>>(q, size_t(B) * kH * kDi, 0.3f, 5);
  fill_f32<<<256, 256, 0, g.stream>>>(w, size_t(B) * kH, 1.f, 6);
  auto set_lens = [&](int ctx) {
    std::vector<int32_t> h(size_t(B), ctx);
    CK(cudaMemcpy(lens, h.data(), h.size() * 4, cudaMemcpyHostToDevice));
  };
  const std::vector<float> hq = down(q, size_t(B) * kH * kDi), hw = down(w, size_t(B) * kH);
  if (profile) {  // a few launches for a profiler (ncu): b1 and b64 indexer at 128K, top-k at 8K and 128K
    for (int ctx : {8192, 131072}) {
      set_lens(ctx);
      for (int nb : {1, 64}) {
        DsaIndexParams p = index_params(pool, keys.bf16, DsaKeyFormat::bf16, nb, lens, q, w, score, kMax);
        p.max_ctx = ctx;
        for (int i = 0; i < 2; ++i) {
          if (nb == 1) p.cache.block_table = pool.d_table + size_t(i + 1) * pool.max_pages;
          dsa_index_cuda(p, g);
        }
        DsaTopkParams t;
        t.n_row = nb, t.topk = kTopk, t.ld = kMax, t.score = score, t.row_len = lens, t.max_len = ctx,
        t.sel = sel;
        for (int i = 0; i < 2; ++i) dsa_topk_cuda(t, g);
      }
    }
    CK(cudaStreamSynchronize(g.stream));
    return 0;
  }

  // ---- checks: sequence 0 at 32K against the references, every format; top-k of 64 rows at 128K
  {
    const int n = 32768;
    set_lens(n);
    for (int mode = 0; mode < 3; ++mode) {
      const DsaKeyFormat fmt = mode == 2 ? DsaKeyFormat::fp8 : DsaKeyFormat::bf16;
      DsaIndexParams p =
          index_params(pool, mode == 2 ? keys.fp8 : keys.bf16, fmt, 1, lens, q, w, score, kMax);
      p.q_exact = mode == 1;
      dsa_index_cuda(p, g);
      CK(cudaStreamSynchronize(g.stream));
      std::vector<float> got = down(score, size_t(n)), ref(static_cast<size_t>(n));
      HostKeys hk = host_keys(pool, mode == 2 ? keys.fp8 : keys.bf16, fmt, 0, n);
      DsaIndexParams r = p;
      r.cache.pages = hk.pages.data(), r.cache.block_table = hk.table.data(),
      r.cache.max_pages = int(hk.table.size());
      r.cache.n_pages = int64_t(hk.table.size());
      std::vector<int32_t> hl(1, n);
      r.ctx_len = hl.data(), r.max_ctx = n, r.q = hq.data(), r.w = hw.data(), r.score = ref.data(), r.ld = n;
      dsa_index_ref(r);
      const double e = nmse(got, ref);
      const char* name[3] = {"bf16", "bf16_qexact", "fp8"};
      std::printf("index scores %s vs fp64 reference: NMSE %.3g\n", name[mode], e);
      check(e < (mode == 2   ? 1e-6
                 : mode == 1 ? 1e-8
                             : 1e-8),
            std::string("index scores ") + name[mode] + " 32K");
    }
    set_lens(kMax);
    dsa_index_cuda(index_params(pool, keys.bf16, DsaKeyFormat::bf16, B, lens, q, w, score, kMax), g);
    DsaTopkParams t;
    t.n_row = B, t.topk = kTopk, t.ld = kMax, t.score = score, t.row_len = lens, t.max_len = kMax,
    t.sel = sel;
    dsa_topk_cuda(t, g);
    CK(cudaStreamSynchronize(g.stream));
    std::vector<float> hs = down(score, size_t(B) * kMax);
    std::vector<int32_t> got = down_i(sel, size_t(B) * kTopk), ref(got.size()), hl(size_t(B), kMax);
    DsaTopkParams r = t;
    r.score = hs.data(), r.row_len = hl.data(), r.sel = ref.data();
    dsa_topk_ref(r);
    check(got == ref, "top-2048 of 64 rows x 128K = reference set");
    for (int64_t n : {int64_t(kMax), int64_t(8192)}) {  // the sample kernel: its candidate path, then staged
      DsaTopkParams ts = t;
      ts.kernel = DsaTopkKernel::sample, ts.max_len = n;
      set_lens(int(n));
      CK(cudaMemset(sel, 0xff, size_t(B) * kTopk * 4));
      dsa_topk_cuda(ts, g);
      CK(cudaStreamSynchronize(g.stream));
      got = down_i(sel, size_t(B) * kTopk);
      std::fill(hl.begin(), hl.end(), int32_t(n));
      r.max_len = n;
      dsa_topk_ref(r);
      check(got == ref, "sample kernel: top-2048 of 64 rows x " + std::to_string(n) + " = reference set");
    }
    // the cluster kernel, its histograms exchanged by cluster barriers (K3_DSA_TOPK_PUSH=0) and pushed (the
    // default): 16 CTAs of 8192 keys a row; then the first 4 rows with 1024-thread CTAs (pushed or not)
    set_lens(kMax);
    std::fill(hl.begin(), hl.end(), int32_t(kMax));
    r.max_len = kMax;
    dsa_topk_ref(r);
    struct ClusterCase {
      bool push, wide;
    };
    for (const ClusterCase c : {ClusterCase{false, false}, ClusterCase{true, false}, ClusterCase{true, true},
                                ClusterCase{false, true}}) {
      DsaTopkParams tc = t;
      tc.kernel = DsaTopkKernel::cluster, tc.cluster = 16, tc.n_row = c.wide ? 4 : B;
      setenv("K3_DSA_TOPK_PUSH", c.push ? "1" : "0", 1);
      setenv("K3_DSA_TOPK_WIDE", c.wide ? "1" : "0", 1);
      CK(cudaMemset(sel, 0xff, size_t(B) * kTopk * 4));
      dsa_topk_cuda(tc, g);
      CK(cudaStreamSynchronize(g.stream));
      unsetenv("K3_DSA_TOPK_PUSH");
      unsetenv("K3_DSA_TOPK_WIDE");
      got = down_i(sel, size_t(tc.n_row) * kTopk);
      check(std::equal(got.begin(), got.end(), ref.begin()),
            std::string("cluster kernel") + (c.push ? ", pushed" : ", cluster barriers") +
                (c.wide ? ", 1024 threads: top-2048 of 4 rows" : ": top-2048 of 64 rows") +
                " x 128K, 16 CTAs a row = reference set");
    }
  }

  // ---- timing
  const float* q0 = q;
  std::vector<double> topk_us_b1, topk_us_b64, sum_us_b1, sum_us_b64, sample_sum_b1, sample_sum_b64,
      nopush_sum_b1, nopush_sum_b64;
  MlaSparseParams sp;
  uint16_t *latent = nullptr, *qm = nullptr;
  float* out = nullptr;
  void* scratch = nullptr;
  {
    const size_t lat = size_t(pool.n_pages) * kP * kMlaRow;
    CK(cudaMalloc(&latent, lat * 2));
    fill_bf16<<<4096, 256, 0, g.stream>>>(latent, lat, kMlaRow, 1.7f, 0, 21);
    CK(cudaMalloc(&qm, size_t(B) * kHeads * kMlaRow * 2));
    fill_bf16<<<1024, 256, 0, g.stream>>>(qm, size_t(B) * kHeads * kMlaRow, kMlaRow, 1.7f, 0, 22);
    CK(cudaMalloc(&out, size_t(B) * kHeads * kMlaLatent * 4));
    CK(cudaMalloc(&scratch, mla_sparse_scratch_bytes(B, kTopk)));
    sp.n_head = kHeads, sp.topk = kTopk, sp.sel = sel, sp.page_size = kP, sp.max_pages = pool.max_pages;
    sp.n_pages = pool.n_pages, sp.block_table = pool.d_table, sp.cache = latent, sp.q = qm;
    sp.scale = 1.f / std::sqrt(192.f), sp.out = out, sp.scratch = scratch;
  }
  for (int ctx : {8192, 32768, 131072}) {
    set_lens(ctx);
    const std::string c = std::to_string(ctx / 1024) + "k";
    for (int nb : {1, 64}) {
      const std::string tag = "b" + std::to_string(nb) + "_ctx" + c;
      // indexer: batch 1 rotates over the 64 sequences (block-table rows), so the keys come from HBM
      for (int f = 0; f < 2; ++f) {
        const DsaKeyFormat fmt = f ? DsaKeyFormat::fp8 : DsaKeyFormat::bf16;
        DsaIndexParams p = index_params(pool, f ? keys.fp8 : keys.bf16, fmt, nb, lens, q0, w, score, kMax);
        p.max_ctx = ctx;
        auto call = [&](int i) {
          DsaIndexParams r = p;
          if (nb == 1) r.cache.block_table = pool.d_table + size_t(i % B) * pool.max_pages;
          dsa_index_cuda(r, g);
        };
        const double us = graph_us(g, call);
        if (nb == 1 && ctx == 131072) {
          emit(tag + (f ? "_index_fp8" : "_index_bf16") + "_eager_us", median_us(g, call), "us");
          if (!f) {  // what bounds batch 1: the CTA count (forced splits), and page scatter (a contiguous
                     // table)
            for (int ns : {128, 256, 512, 1024, 2048}) {
              DsaIndexParams r = p;
              r.n_split = ns;
              emit(tag + "_index_bf16_split" + std::to_string(ns) + "_us",
                   graph_us(g,
                            [&](int i) {
                              r.cache.block_table = pool.d_table + size_t(i % B) * pool.max_pages;
                              dsa_index_cuda(r, g);
                            }),
                   "us");
            }
            DsaIndexParams r6 = p;  // a 6-tile ring (all of a CTA's tiles in flight at 128K)
            r6.stages = 6;
            emit(tag + "_index_bf16_stages6_us",
                 graph_us(g,
                          [&](int i) {
                            r6.cache.block_table = pool.d_table + size_t(i % B) * pool.max_pages;
                            dsa_index_cuda(r6, g);
                          }),
                 "us");
            std::vector<int32_t> ident(pool.table.size());
            std::iota(ident.begin(), ident.end(), 0);
            int32_t* d_ident;
            CK(cudaMalloc(&d_ident, ident.size() * 4));
            CK(cudaMemcpy(d_ident, ident.data(), ident.size() * 4, cudaMemcpyHostToDevice));
            emit(tag + "_index_bf16_contiguous_us",
                 graph_us(g,
                          [&](int i) {
                            DsaIndexParams r = p;
                            r.cache.block_table = d_ident + size_t(i % B) * pool.max_pages;
                            dsa_index_cuda(r, g);
                          }),
                 "us");
            CK(cudaFree(d_ident));
          }
        }
        const double bytes = double(nb) * ctx * (f ? kDi + 4 : 2 * kDi);
        const std::string m = tag + (f ? "_index_fp8" : "_index_bf16");
        emit(m + "_us", us, "us");
        emit(m + "_key_GBps", bytes / us * 1e-3, "GB/s", "cudaMemcpy D2D GB/s", copy,
             ctx == 131072 ? "indexer within 1.3x of its byte floor (>= 0.77 of copy bandwidth)" : nullptr,
             1 / 1.3);
      }
      // top-k over the bf16 scores of this context (recomputed: the timing above rotated the rows)
      dsa_index_cuda(index_params(pool, keys.bf16, DsaKeyFormat::bf16, nb, lens, q0, w, score, kMax), g);
      DsaTopkParams t;
      t.n_row = nb, t.topk = kTopk, t.ld = kMax, t.score = score, t.row_len = lens, t.max_len = ctx,
      t.sel = sel;
      const double tk = graph_us(g, [&](int) { dsa_topk_cuda(t, g); });
      if (nb == 1 && ctx == 131072)
        emit(tag + "_topk_eager_us", median_us(g, [&](int) { dsa_topk_cuda(t, g); }), "us");
      for (int c : {1, 2, 4, 8, 16}) {  // CTAs per row forced (the automatic choice: dsa_topk_cuda.cu)
        if (ctx > 16384 * int64_t(c)) continue;  // not staged
        DsaTopkParams tc = t;
        tc.cluster = c;
        emit(tag + "_topk_c" + std::to_string(c) + "_us", graph_us(g, [&](int) { dsa_topk_cuda(tc, g); }),
             "us");
        if (c > 1) {  // the histograms exchanged by cluster barriers (K3_DSA_TOPK_PUSH=0)
          setenv("K3_DSA_TOPK_PUSH", "0", 1);
          emit(tag + "_topk_c" + std::to_string(c) + "_nopush_us",
               graph_us(g, [&](int) { dsa_topk_cuda(tc, g); }), "us");
          unsetenv("K3_DSA_TOPK_PUSH");
        }
      }
      setenv("K3_DSA_TOPK_PUSH", "0", 1);  // the automatic choice with cluster barriers (before session 20)
      const double tkn = graph_us(g, [&](int) { dsa_topk_cuda(t, g); });
      emit(tag + "_topk_nopush_us", tkn, "us");
      unsetenv("K3_DSA_TOPK_PUSH");
      for (const char* w : {"0", "1"}) {  // 512-thread CTAs always; 1024 wherever the clusters run at once
        setenv("K3_DSA_TOPK_WIDE", w, 1);
        emit(tag + (w[0] == '0' ? "_topk_nowide_us" : "_topk_wide_us"),
             graph_us(g, [&](int) { dsa_topk_cuda(t, g); }), "us");
        unsetenv("K3_DSA_TOPK_WIDE");
      }
      DsaTopkParams ts = t;  // the one-CTA sample-select kernel (dsa_topk_sample_cuda.cu)
      ts.kernel = DsaTopkKernel::sample;
      const double tks = graph_us(g, [&](int) { dsa_topk_cuda(ts, g); });
      emit(tag + "_topk_sample_us", tks, "us");
      (nb == 1 ? topk_us_b1 : topk_us_b64).push_back(tk);
      const double tk8 = (nb == 1 ? topk_us_b1 : topk_us_b64).front();
      emit_met(tag + "_topk_us", tk, "us", "top-k us at 8K", tk8, "flat in context (<= 1.3x the 8K time)",
               tk <= 1.3 * tk8);
      // sparse MLA over the selection
      MlaSparseParams s = sp;
      s.n_q = nb;
      const double ms = graph_us(g, [&](int) { mla_sparse_cuda(s, g); });
      emit(tag + "_sparse_mla_us", ms, "us");
      if (ctx ==
          131072)  // the decode kernel's KV splits over 2048 rows (its own choice at b1: 32 of one tile)
        for (int ns : {2, 4, 8, 16}) {
          MlaSparseParams r = s;
          r.n_split = ns;
          emit(tag + "_sparse_mla_split" + std::to_string(ns) + "_us",
               graph_us(g, [&](int) { mla_sparse_cuda(r, g); }), "us");
        }
      setenv("K3_MLA_SPARSE_GATHER", "1", 1);  // the gather path, for comparison
      emit(tag + "_sparse_mla_gather_us", graph_us(g, [&](int) { mla_sparse_cuda(s, g); }), "us");
      unsetenv("K3_MLA_SPARSE_GATHER");
      setenv("K3_MLA_EXACT_PIECES", "3", 1);  // exact P (three bf16 pieces) instead of 16 bits (two)
      emit(tag + "_sparse_mla_p3_us", graph_us(g, [&](int) { mla_sparse_cuda(s, g); }), "us");
      unsetenv("K3_MLA_EXACT_PIECES");
      (nb == 1 ? sum_us_b1 : sum_us_b64).push_back(tk + ms);
      const double sum8 = (nb == 1 ? sum_us_b1 : sum_us_b64).front();
      emit_met(tag + "_topk_sparse_mla_us", tk + ms, "us", "top-k + sparse MLA us at 8K", sum8,
               "top-2048 + sparse MLA cost flat in context (<= 1.3x the 8K time)", tk + ms <= 1.3 * sum8);
      (nb == 1 ? nopush_sum_b1 : nopush_sum_b64).push_back(tkn + ms);
      const double nopush8 = (nb == 1 ? nopush_sum_b1 : nopush_sum_b64).front();
      emit_met(tag + "_topk_nopush_sparse_mla_us", tkn + ms, "us",
               "top-k (K3_DSA_TOPK_PUSH=0) + sparse MLA us at 8K", nopush8,
               "top-2048 + sparse MLA cost flat in context (<= 1.3x the 8K time)", tkn + ms <= 1.3 * nopush8);
      (nb == 1 ? sample_sum_b1 : sample_sum_b64).push_back(tks + ms);
      const double sample8 = (nb == 1 ? sample_sum_b1 : sample_sum_b64).front();
      emit_met(tag + "_topk_sample_sparse_mla_us", tks + ms, "us",
               "top-k (sample kernel) + sparse MLA us at 8K", sample8,
               "top-2048 + sparse MLA cost flat in context (<= 1.3x the 8K time)", tks + ms <= 1.3 * sample8);
    }
  }
  {  // sparse MLA check: query 0 (the last selection: 64 x 128K), heads all, against the fp64 reference
    MlaSparseParams s = sp;
    s.n_q = 1;
    mla_sparse_cuda(s, g);
    CK(cudaStreamSynchronize(g.stream));
    std::vector<float> got = down(out, size_t(kHeads) * kMlaLatent), ref(got.size());
    std::vector<int32_t> hsel = down_i(sel, kTopk);
    // host rows of the selected positions, addressed through a page_size-1 table
    std::vector<uint16_t> rows(size_t(kTopk) * kMlaRow), hq(size_t(kHeads) * kMlaRow);
    std::vector<int32_t> table(size_t(kMax), 0);
    for (int j = 0; j < kTopk; ++j) {
      const int32_t s0 = hsel[size_t(j)];
      const int32_t page = pool.table[size_t(s0 / kP)];
      CK(cudaMemcpy(rows.data() + size_t(j) * kMlaRow, latent + (size_t(page) * kP + s0 % kP) * kMlaRow,
                    kMlaRow * 2, cudaMemcpyDeviceToHost));
      table[size_t(s0)] = j;
    }
    CK(cudaMemcpy(hq.data(), qm, hq.size() * 2, cudaMemcpyDeviceToHost));
    MlaSparseParams r = s;
    r.sel = hsel.data(), r.page_size = 1, r.max_pages = kMax, r.n_pages = kTopk, r.block_table = table.data();
    r.cache = rows.data(), r.q = hq.data(), r.out = ref.data();
    mla_sparse_ref(r);
    const double e = nmse(got, ref);
    std::printf("sparse MLA vs fp64 reference: NMSE %.3g\n", e);
    check(e < 1e-5, "sparse MLA (96 heads, 2048 of 128K) = reference");
    setenv("K3_MLA_EXACT_PIECES", "3", 1);
    mla_sparse_cuda(s, g);
    unsetenv("K3_MLA_EXACT_PIECES");
    CK(cudaStreamSynchronize(g.stream));
    const double e2 = nmse(down(out, size_t(kHeads) * kMlaLatent), ref);
    std::printf("sparse MLA, P in three pieces, vs fp64 reference: NMSE %.3g (two: %.3g)\n", e2, e);
    check(e2 < 1e-5, "sparse MLA, P in three pieces (K3_MLA_EXACT_PIECES=3) = reference");
  }

  // ---- FP8 accuracy against bf16 keys: random keys (the pool above) and structured ones
  for (int kind = 0; kind < 2; ++kind) {
    const int nb = 8, ctx = 32768;
    Pool sp2 = make_pool(nb, ctx, 3);
    Keys k2 = kind == 0 ? Keys{} : make_keys(g, sp2, 1, 31);
    const Pool& pp = kind == 0 ? pool : sp2;
    const Keys& kk = kind == 0 ? keys : k2;
    if (kind == 1) {  // queries: each head a noisy copy of one token's key (peaky, realistic scores)
      std::vector<float> hq2(size_t(nb) * kH * kDi);
      std::mt19937_64 r(9);
      for (int i = 0; i < nb; ++i)
        for (int h = 0; h < kH; ++h) {
          HostKeys one = host_keys(pp, kk.bf16, DsaKeyFormat::bf16, i, kP);
          const int slot = int(r() % kP);
          for (int e = 0; e < kDi; ++e) {
            uint16_t v;
            std::memcpy(&v, one.pages.data() + (size_t(slot) * kDi + e) * 2, 2);
            hq2[(size_t(i) * kH + h) * kDi + e] =
                0.3f * bf16_to_f32(v) + 0.05f * float(int(r() % 200) - 100) / 100.f;
          }
        }
      CK(cudaMemcpy(q, hq2.data(), hq2.size() * 4, cudaMemcpyHostToDevice));
    }
    set_lens(ctx);
    std::vector<std::vector<float>> sc(2);
    std::vector<std::vector<int32_t>> se(2);
    for (int f = 0; f < 2; ++f) {
      DsaIndexParams p = index_params(pp, f ? kk.fp8 : kk.bf16, f ? DsaKeyFormat::fp8 : DsaKeyFormat::bf16,
                                      nb, lens, q, w, score, kMax);
      p.max_ctx = ctx;
      dsa_index_cuda(p, g);
      DsaTopkParams t;
      t.n_row = nb, t.topk = kTopk, t.ld = kMax, t.score = score, t.row_len = lens, t.max_len = ctx,
      t.sel = sel;
      dsa_topk_cuda(t, g);
      CK(cudaStreamSynchronize(g.stream));
      sc[size_t(f)].resize(size_t(nb) * ctx);
      for (int i = 0; i < nb; ++i) {
        auto row = down(score + size_t(i) * kMax, ctx);
        std::copy(row.begin(), row.end(), sc[size_t(f)].begin() + size_t(i) * ctx);
      }
      se[size_t(f)] = down_i(sel, size_t(nb) * kTopk);
    }
    int64_t same = 0;
    for (int i = 0; i < nb; ++i) {
      std::vector<int32_t> a(se[0].begin() + i * kTopk, se[0].begin() + (i + 1) * kTopk),
          b(se[1].begin() + i * kTopk, se[1].begin() + (i + 1) * kTopk), both;
      std::set_intersection(a.begin(), a.end(), b.begin(), b.end(), std::back_inserter(both));
      same += int64_t(both.size());
    }
    const double overlap = double(same) / (double(nb) * kTopk), e = nmse(sc[1], sc[0]);
    const std::string tag = std::string("fp8_vs_bf16_") + (kind ? "structured" : "random") + "_b8_ctx32k";
    emit(tag + "_topk_overlap", overlap, "fraction", "goal (MODEL.md §13: >= 99% of selected positions)",
         0.99, ">= 0.99 overlap", 1.0);
    emit(tag + "_score_nmse", e, "nmse");
    if (kind == 1) {
      CK(cudaFree(k2.bf16));
      CK(cudaFree(k2.fp8));
    }
    CK(cudaFree(sp2.d_table));
  }
  std::printf("%s\n", g_fail ? "CHECKS FAILED" : "all checks OK");
  return g_fail ? 1 : 0;
}
