// bench_mla_decode.cu: absorbed MLA decode over the paged latent cache on one GPU (ops/mla_decode.h).
//
//   bench_mla_decode [OUT.jsonl] [COMMIT]
// 1. the two ceilings: copy bandwidth (cudaMemcpy D2D of 2 GiB, GB/s = read + write bytes / time) and the
//    bf16 GEMM rate (cublasGemmEx 8192^3, bf16 in, fp32 accumulate, median of 10).
// 2. correctness: the kernels (default = mla_decode_cuda, the default dispatch; mma = mla_decode_cuda_mma,
//    mma.sync; wgmma = mla_decode_cuda_wgmma, heads as the MMA's M; wgmma_hn = mla_decode_cuda_wgmma_hn,
//    heads as its N; simple = mla_decode_cuda_simple) against the fp64 host reference mla_decode_ref, 96
//    heads, P = 64, shuffled pages, lens {1, 17, 989, 4097}; then on the timed shapes, heads {0, 47, 95} of
//    the first and the last sequence against the reference.
// 3. timing: batch 64 x 32K and batch 1 x 4K / 32K / 128K (96 heads, P = 64, pages shuffled): median of 20
//    calls after 3 warm-ups (CUDA events around each call); GB/s on cache bytes (n_seq * ctx * 576 * 2) and
//    the ratio to the copy, TFLOP/s (n_seq * ctx * 96 * (576 + 512) * 2) and the ratio to the GEMM rate.
//    Small caches rotate over several layer pools (>= 256 MiB in all) so L2 (50 MiB) does not hold them.
// The wgmma kernels are also timed at forced split counts (metric suffix _splitN). All but simple are timed;
// K3_MLA_BENCH_ALL=1 also times the CUDA-core kernel (checks always run for all five). Before session 15
// "mma" named the default dispatch (wgmma from 16K rows).
// K3_MLA_BENCH_CHECK_ONLY=1 stops after the first correctness section; K3_MLA_BENCH_ONLY=TAG[+TAG...] times
// only the shapes whose tag contains one of the TAGs (b64, b1_ctx4k, ...).
// Every metric is printed and appended as a JSON line (bench, commit, machine, metric, value, unit, peer,
// peer_value, ratio, goal, met). Build: bash bench/mla_cuda/build.sh.
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "ops/mla_decode.h"

#include "../cuda_bench_util.cuh"

using namespace k3;

namespace {

struct Setup {
  MlaDecodeParams p;
  std::vector<int32_t> lens, table;
  int64_t pool_elems = 0;
  int n_pool = 1;
  std::vector<uint16_t*> pools;
  int32_t *d_lens = nullptr, *d_table = nullptr;
  uint16_t* d_q = nullptr;
  float* d_out = nullptr;
};

Setup make(std::vector<int32_t> lens, int H, int P, size_t min_bytes, uint64_t seed) {
  Setup s;
  s.lens = lens;
  std::mt19937_64 rng(seed);
  const int n_seq = int(lens.size()), max_ctx = *std::max_element(lens.begin(), lens.end());
  const int max_pages = (max_ctx + P - 1) / P;
  int64_t n_pages = 0;
  for (int l : lens) n_pages += (l + P - 1) / P;
  std::vector<int32_t> perm(static_cast<size_t>(n_pages));
  std::iota(perm.begin(), perm.end(), 0);
  std::shuffle(perm.begin(), perm.end(), rng);
  s.table.assign(size_t(n_seq) * max_pages, -1);
  size_t next = 0;
  for (int b = 0; b < n_seq; ++b)
    for (int j = 0; j < (lens[size_t(b)] + P - 1) / P; ++j) s.table[size_t(b) * max_pages + j] = perm[next++];
  s.pool_elems = n_pages * P * kMlaRow;
  const size_t pool_bytes = size_t(s.pool_elems) * 2;
  s.n_pool = int(std::max<size_t>(1, (min_bytes + pool_bytes - 1) / pool_bytes));
  for (int i = 0; i < s.n_pool; ++i) {
    uint16_t* d;
    CK(cudaMalloc(&d, pool_bytes));
    fill_bf16<<<1024, 256>>>(d, size_t(s.pool_elems), seed * 131 + i);
    s.pools.push_back(d);
  }
  CK(cudaMalloc(&s.d_lens, lens.size() * 4));
  CK(cudaMalloc(&s.d_table, s.table.size() * 4));
  CK(cudaMemcpy(s.d_lens, lens.data(), lens.size() * 4, cudaMemcpyHostToDevice));
  CK(cudaMemcpy(s.d_table, s.table.data(), s.table.size() * 4, cudaMemcpyHostToDevice));
  CK(cudaMalloc(&s.d_q, size_t(n_seq) * H * kMlaRow * 2));
  fill_bf16<<<256, 256>>>(s.d_q, size_t(n_seq) * H * kMlaRow, seed * 7 + 3);
  CK(cudaMalloc(&s.d_out, size_t(n_seq) * H * kMlaLatent * 4));
  CK(cudaGetLastError());
  MlaDecodeParams& p = s.p;
  p.n_seq = n_seq, p.n_head = H, p.page_size = P, p.max_pages = max_pages, p.n_pages = n_pages;
  p.max_ctx = max_ctx, p.ctx_len = s.d_lens, p.block_table = s.d_table, p.cache = s.pools[0];
  p.q = s.d_q, p.scale = 1.f / std::sqrt(192.f), p.out = s.d_out;
  return s;
}

void destroy(Setup& s) {
  for (auto* d : s.pools) CK(cudaFree(d));
  CK(cudaFree(s.d_lens));
  CK(cudaFree(s.d_table));
  CK(cudaFree(s.d_q));
  CK(cudaFree(s.d_out));
}

using Kernel = void (*)(const MlaDecodeParams&, GpuContext&);

// Compares (seq, head) pairs of the device output with the fp64 reference on host copies.
void check(Setup& s, Kernel k, GpuContext& g, const char* name, const std::vector<int>& seqs,
           const std::vector<int>& heads) {
  s.p.cache = s.pools[0];
  k(s.p, g);
  CK(cudaStreamSynchronize(g.stream));
  CK(cudaGetLastError());
  const int H = s.p.n_head;
  std::vector<float> out(size_t(s.p.n_seq) * H * kMlaLatent);
  CK(cudaMemcpy(out.data(), s.d_out, out.size() * 4, cudaMemcpyDeviceToHost));
  std::vector<uint16_t> cache(size_t(s.pool_elems)), q(size_t(s.p.n_seq) * H * kMlaRow);
  CK(cudaMemcpy(cache.data(), s.pools[0], cache.size() * 2, cudaMemcpyDeviceToHost));
  CK(cudaMemcpy(q.data(), s.d_q, q.size() * 2, cudaMemcpyDeviceToHost));
  double err2 = 0, ref2 = 0, max_abs = 0;
  for (int b : seqs)
    for (int h : heads) {
      MlaDecodeParams r = s.p;  // one (seq, head): a 1-seq, 1-head view
      std::vector<uint16_t> qh(q.begin() + (size_t(b) * H + h) * kMlaRow,
                               q.begin() + (size_t(b) * H + h + 1) * kMlaRow);
      std::vector<float> o(kMlaLatent);
      r.n_seq = 1, r.n_head = 1, r.n_split = 0;
      r.ctx_len = &s.lens[size_t(b)], r.block_table = &s.table[size_t(b) * s.p.max_pages];
      r.cache = cache.data(), r.q = qh.data(), r.out = o.data();
      mla_decode_ref(r);
      for (int i = 0; i < kMlaLatent; ++i) {
        const double d = double(out[(size_t(b) * H + h) * kMlaLatent + i]) - o[size_t(i)];
        err2 += d * d, ref2 += double(o[size_t(i)]) * o[size_t(i)];
        max_abs = std::max(max_abs, std::fabs(d));
        if (!std::isfinite(out[(size_t(b) * H + h) * kMlaLatent + i])) max_abs = INFINITY;
      }
    }
  const double nmse = err2 / ref2;
  const bool ok = nmse <= 1e-5 && std::isfinite(max_abs);
  g_fail += !ok;
  std::printf("check %-6s n_seq=%d max_ctx=%d pairs=%zu: nmse %.3g max_abs %.3g %s\n", name, s.p.n_seq,
              s.p.max_ctx, seqs.size() * heads.size(), nmse, max_abs, ok ? "OK" : "FAIL");
}

double time_us(Setup& s, Kernel k, GpuContext& g) {
  const int iters = 20;
  std::vector<cudaEvent_t> ev(iters + 1);
  for (auto& e : ev) CK(cudaEventCreate(&e));
  for (int i = 0; i < 3; ++i) s.p.cache = s.pools[size_t(i % s.n_pool)], k(s.p, g);
  CK(cudaEventRecord(ev[0], g.stream));
  for (int i = 0; i < iters; ++i) {
    s.p.cache = s.pools[size_t(i % s.n_pool)], k(s.p, g);
    CK(cudaEventRecord(ev[size_t(i) + 1], g.stream));
  }
  CK(cudaEventSynchronize(ev[iters]));
  std::vector<float> ms(iters);
  for (int i = 0; i < iters; ++i) CK(cudaEventElapsedTime(&ms[size_t(i)], ev[size_t(i)], ev[size_t(i) + 1]));
  for (auto& e : ev) CK(cudaEventDestroy(e));
  std::sort(ms.begin(), ms.end());
  return ms[iters / 2] * 1e3;
}

}  // namespace

// K3_MLA_BENCH_ONLY: tag fragments joined by '+'; unset = every shape.
bool wanted(const char* tag) {
  const char* only = std::getenv("K3_MLA_BENCH_ONLY");
  if (!only || !*only) return true;
  std::string list = only;
  for (size_t a = 0; a <= list.size();) {
    const size_t e = std::min(list.find('+', a), list.size());
    if (e > a && std::strstr(tag, list.substr(a, e - a).c_str())) return true;
    a = e + 1;
  }
  return false;
}

int main(int argc, char** argv) {
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
  const double copy = copy_bandwidth(g), gemm = gemm_tflops(g);

  const bool all = std::getenv("K3_MLA_BENCH_ALL") && std::getenv("K3_MLA_BENCH_ALL")[0] == '1';
  std::vector<std::pair<Kernel, const char*>> kernels = {
      {mla_decode_cuda, "default"},
      {mla_decode_cuda_mma, "mma"},
      {mla_decode_cuda_wgmma, "wgmma"},
      {mla_decode_cuda_wgmma_hn, "wgmma_hn"},
      {mla_decode_cuda_simple, "simple"}};
  {  // correctness, every (seq, head)
    Setup s = make({1, 17, 989, 4097}, 96, 64, 0, 1);
    std::vector<int> heads(96);
    std::iota(heads.begin(), heads.end(), 0);
    for (auto [k, name] : kernels) check(s, k, g, name, {0, 1, 2, 3}, heads);
    destroy(s);
  }
  if (std::getenv("K3_MLA_BENCH_CHECK_ONLY")) {  // the correctness section only
    std::printf("%s\n", g_fail ? "CHECKS FAILED" : "all checks OK");
    return g_fail ? 1 : 0;
  }
  if (!all) kernels.resize(4);
  struct Shape {
    int n_seq, ctx;
    const char* tag;
    bool goal;
  };
  for (Shape sh : {Shape{64, 32768, "b64_ctx32k", true}, Shape{1, 4096, "b1_ctx4k", false},
                   Shape{1, 32768, "b1_ctx32k", false}, Shape{1, 131072, "b1_ctx128k", false}}) {
    if (!wanted(sh.tag)) continue;
    Setup s = make(std::vector<int32_t>(size_t(sh.n_seq), sh.ctx), 96, 64, size_t(256) << 20, 7 + sh.n_seq);
    const double bytes = double(sh.n_seq) * sh.ctx * kMlaRow * 2;
    const double flops = double(sh.n_seq) * sh.ctx * 96 * (kMlaRow + kMlaLatent) * 2;
    for (auto [k, name] : kernels) {
      check(s, k, g, name, {0, sh.n_seq - 1}, {0, 47, 95});
      const double us = time_us(s, k, g);
      const std::string tag = std::string(sh.tag) + "_" + name;
      emit(tag + "_us", us, "us");
      emit(tag + "_cache_GBps", bytes / us * 1e-3, "GB/s", "cudaMemcpy D2D GB/s", copy,
           sh.goal ? ">= 0.85 of copy bandwidth on cache bytes" : nullptr, 0.85);
      if (gemm > 0) emit(tag + "_TFLOPs", flops / us * 1e-6, "TFLOP/s", "cublasGemmEx bf16 TFLOP/s", gemm);
      // forced split counts (auto = the fewest whole waves of 132 SMs)
      if (k == mla_decode_cuda_wgmma || k == mla_decode_cuda_wgmma_hn)
        for (int ns : sh.n_seq > 1 ? std::vector<int>{1, 3} : std::vector<int>{33, 132}) {
          s.p.n_split = ns;
          const double us_ns = time_us(s, k, g);
          s.p.n_split = 0;
          emit(tag + "_split" + std::to_string(ns) + "_cache_GBps", bytes / us_ns * 1e-3, "GB/s",
               "cudaMemcpy D2D GB/s", copy);
        }
    }
    destroy(s);
  }
  std::printf("%s\n", g_fail ? "CHECKS FAILED" : "all checks OK");
  return g_fail ? 1 : 0;
}
