// bench_mla_prefill.cu: dense causal MLA prefill attention on one GPU (ops/mla_prefill.h).
//
//   bench_mla_prefill [OUT.jsonl] [COMMIT]
// 1. the ceiling: the bf16 GEMM rate (cublasGemmEx 8192^3, median of 10), peer of every ratio.
// 2. correctness: (query, head) pairs of every timed shape against the fp64 host reference
//    mla_prefill_ref (NMSE <= 1e-5), plus a 300-token, 96-head shape after a 77-token prefix in full.
// 3. timing: 96 heads, q = k = 192, v = 128, the model's layout (k_nope | v interleaved per head, the rope
// key
//    shared from the 576-wide latent row), n_q = 4096 and 32768 from position 0: median of 5 (32K) or 20
//    calls; causal FLOPs = 96 * n_q (n_q + 1) / 2 * (192 + 128) * 2; TFLOP/s and the ratio to the GEMM rate.
// Build: bash bench/mla_cuda/build.sh.
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "../cuda_bench_util.cuh"
#include "core/dtype.h"
#include "ops/mla_prefill.h"

using namespace k3;

namespace {

struct Setup {
  MlaPrefillParams p;
  int H = 0;
  uint16_t *q = nullptr, *kv = nullptr, *lat = nullptr;
  float* out = nullptr;
};

Setup make(int H, int n_q, int q_pos0, uint64_t seed) {
  Setup s;
  s.H = H;
  const size_t n_kv = size_t(q_pos0) + n_q;
  CK(cudaMalloc(&s.q, size_t(n_q) * H * kMlaPrefillQk * 2));
  CK(cudaMalloc(&s.kv, n_kv * H * 256 * 2));
  CK(cudaMalloc(&s.lat, n_kv * 576 * 2));
  CK(cudaMalloc(&s.out, size_t(n_q) * H * kMlaPrefillV * 4));
  fill_bf16<<<1024, 256>>>(s.q, size_t(n_q) * H * kMlaPrefillQk, seed);
  fill_bf16<<<1024, 256>>>(s.kv, n_kv * H * 256, seed + 1);
  fill_bf16<<<1024, 256>>>(s.lat, n_kv * 576, seed + 2);
  CK(cudaGetLastError());
  MlaPrefillParams& p = s.p;
  p.n_q = n_q, p.n_kv = int(n_kv), p.n_head = H, p.q_pos0 = q_pos0, p.scale = 1.f / std::sqrt(192.f);
  p.q = s.q, p.q_tok_stride = int64_t(H) * kMlaPrefillQk, p.q_head_stride = kMlaPrefillQk;
  p.k_nope = s.kv, p.k_tok_stride = int64_t(H) * 256, p.k_head_stride = 256;
  p.v = s.kv + kMlaPrefillNope, p.v_tok_stride = int64_t(H) * 256, p.v_head_stride = 256;
  p.k_rope = s.lat + 512, p.r_tok_stride = 576, p.r_head_stride = 0;
  p.out = s.out;
  return s;
}

void destroy(Setup& s) {
  CK(cudaFree(s.q));
  CK(cudaFree(s.kv));
  CK(cudaFree(s.lat));
  CK(cudaFree(s.out));
}

// Runs once and compares rows x heads with the fp64 reference on host copies (rows: query indices).
void check(Setup& s, GpuContext& g, const std::vector<int>& rows, const std::vector<int>& heads) {
  const MlaPrefillParams& p = s.p;
  CK(cudaMemset(s.out, 0xFF, size_t(p.n_q) * s.H * kMlaPrefillV * 4));  // NaN poison
  mla_prefill_cuda(p, g);
  CK(cudaStreamSynchronize(g.stream));
  CK(cudaGetLastError());
  const size_t n_kv = size_t(p.n_kv);
  std::vector<float> out(size_t(p.n_q) * s.H * kMlaPrefillV);
  std::vector<uint16_t> q(size_t(p.n_q) * s.H * kMlaPrefillQk), kv(n_kv * s.H * 256), lat(n_kv * 576);
  CK(cudaMemcpy(out.data(), s.out, out.size() * 4, cudaMemcpyDeviceToHost));
  CK(cudaMemcpy(q.data(), s.q, q.size() * 2, cudaMemcpyDeviceToHost));
  CK(cudaMemcpy(kv.data(), s.kv, kv.size() * 2, cudaMemcpyDeviceToHost));
  CK(cudaMemcpy(lat.data(), s.lat, lat.size() * 2, cudaMemcpyDeviceToHost));
  double err2 = 0, ref2 = 0;
  bool finite = true;
  for (int t : rows)
    for (int h : heads) {
      MlaPrefillParams r = p;  // one query, one head: a view starting at query t
      std::vector<float> o(kMlaPrefillV);
      r.n_q = 1, r.q_pos0 = p.q_pos0 + t, r.n_head = 1;
      r.q = q.data() + (size_t(t) * s.H + h) * kMlaPrefillQk;
      r.k_nope = kv.data() + size_t(h) * 256, r.v = kv.data() + size_t(h) * 256 + kMlaPrefillNope;
      r.k_rope = lat.data() + 512, r.out = o.data();
      mla_prefill_ref(r);
      for (int i = 0; i < kMlaPrefillV; ++i) {
        const float y = out[(size_t(t) * s.H + h) * kMlaPrefillV + i];
        finite = finite && std::isfinite(y);
        err2 += (double(y) - o[size_t(i)]) * (double(y) - o[size_t(i)]),
            ref2 += double(o[size_t(i)]) * o[size_t(i)];
      }
    }
  const bool ok = finite && err2 / ref2 <= 1e-5;
  g_fail += !ok;
  std::printf("check n_q=%d q_pos0=%d pairs=%zu: nmse %.3g %s\n", p.n_q, p.q_pos0, rows.size() * heads.size(),
              err2 / ref2, ok ? "OK" : "FAIL");
}

}  // namespace

int main(int argc, char** argv) {
  g_bench = "mla_prefill_cuda";
  if (argc > 1) g_out = argv[1];
  if (argc > 2) g_commit = argv[2];
  cudaDeviceProp prop;
  CK(cudaGetDeviceProperties(&prop, 0));
  g_machine = prop.name;
  GpuContext g;
  CK(cudaStreamCreate(&g.stream));
  const double gemm = gemm_tflops(g);
  {
    Setup s = make(96, 300, 77, 5);
    std::vector<int> rows(300), heads(96);
    for (int i = 0; i < 300; ++i) rows[size_t(i)] = i;
    for (int i = 0; i < 96; ++i) heads[size_t(i)] = i;
    check(s, g, rows, heads);
    destroy(s);
  }
  for (int n_q : {4096, 32768}) {
    Setup s = make(96, n_q, 0, 9 + n_q);
    check(s, g, {0, 1, 127, n_q / 2 + 3, n_q - 1}, {0, 41, 95});
    const int iters = n_q > 4096 ? 5 : 20;
    std::vector<cudaEvent_t> ev(size_t(iters) + 1);
    for (auto& e : ev) CK(cudaEventCreate(&e));
    mla_prefill_cuda(s.p, g);  // warm-up
    CK(cudaEventRecord(ev[0], g.stream));
    for (int i = 0; i < iters; ++i) {
      mla_prefill_cuda(s.p, g);
      CK(cudaEventRecord(ev[size_t(i) + 1], g.stream));
    }
    CK(cudaEventSynchronize(ev[size_t(iters)]));
    std::vector<float> ms(static_cast<size_t>(iters));
    for (int i = 0; i < iters; ++i)
      CK(cudaEventElapsedTime(&ms[size_t(i)], ev[size_t(i)], ev[size_t(i) + 1]));
    for (auto& e : ev) CK(cudaEventDestroy(e));
    std::sort(ms.begin(), ms.end());
    const double us = ms[size_t(iters) / 2] * 1e3;
    const double flops = 96.0 * n_q * (n_q + 1.0) / 2 * (kMlaPrefillQk + kMlaPrefillV) * 2;
    const std::string tag = "prefill_h96_n" + std::to_string(n_q / 1024) + "k";
    emit(tag + "_us", us, "us");
    if (gemm > 0) emit(tag + "_TFLOPs", flops / us * 1e-6, "TFLOP/s", "cublasGemmEx bf16 TFLOP/s", gemm);
    destroy(s);
  }
  std::printf("%s\n", g_fail ? "CHECKS FAILED" : "all checks OK");
  return g_fail ? 1 : 0;
}
