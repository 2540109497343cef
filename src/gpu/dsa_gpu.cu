// dsa_gpu.cu: the K3.1 DSA lightning indexer on the GPU (model/dsa.cpp, MODEL.md §6).
//
//   k^I_s = bf16(LayerNorm(wk x_s; k_norm, eps 1e-6))          appended to the sequence's index-key cache
//   q^I_t = wq_b c^Q_t [Hi, Di];  a_t = weights_proj x_t [Hi]
//   I[t, s] = (Hi Di)^-1/2 sum_h a_{t,h} relu(q^I_{t,h} . k^I_s)     s <= t, fp32
//   S_t = every s <= t when t (1-based) <= topk; else the topk largest I[t, s], ties -> lower s, ascending
//
// Default since session 4 (checked on the H200; K3_DSA_FAST=0 keeps the generic path below, validated in
// session 2), bf16 mode (index head dim a multiple of 16, <= 128; <= 64 index
// heads): the ops of ops/dsa_index.h and ops/dsa_topk.h. The index keys (bf16 values in this mode) are kept
// in bf16 pages of the model's pool beside the fp32 rows (cache_pool_gpu.cuh; appended by mla_gpu.cu, exact),
// scored on tensor cores (q^I and a are bf16 already: the linears round their outputs in this mode, on the
// CPU too), and the exact radix top-k picks the same set as the CPU's partial_sort of the same scores; the
// scores differ from the CPU's only by fp32 summation order. A decode call scores and selects every
// sequence's row in one launch each (dsa_select_rows_gpu). fp32 mode keeps the generic path: selection
// without sorting, s is selected iff fewer than topk positions beat it (larger score, or equal score at a
// lower position), then the selected positions are compacted in ascending order with a block scan (O(n_vis^2)
// per query; exact fp32 sums in the CPU's order).
#include <cub/block/block_scan.cuh>

#include <cmath>
#include <cstdlib>

#include "core/env.h"
#include "gpu/blocks_gpu.cuh"
#include "gpu/cache_pool_gpu.cuh"
#include "ops/dsa_index.h"
#include "ops/dsa_topk.h"
#include "ops/layer_norm.h"

namespace k3::gpu {

namespace {

// I[i, s] for s < n_past + i + 1 (one thread each); row stride n_ctx.
__global__ void index_score_kernel(float* I, const float* qI, const float* a, const float* kI, int64_t n_tok,
                                   int64_t n_past, int64_t n_ctx, int Hi, int Di, float scale) {
  const int64_t idx = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx >= n_tok * n_ctx) return;
  const int64_t i = idx / n_ctx, s = idx % n_ctx;
  if (s > n_past + i) return;
  const float* qt = qI + i * Hi * Di;
  const float* at = a + i * Hi;
  const float* ks = kI + s * Di;
  float acc = 0.f;
  for (int h = 0; h < Hi; ++h) {
    float d = 0.f;
    for (int e = 0; e < Di; ++e) d += qt[h * Di + e] * ks[e];
    acc += at[h] * fmaxf(d, 0.f);
  }
  I[idx] = acc * scale;
}

// flag[i, s] = 1 iff fewer than topk visible positions beat s.
__global__ void index_rank_kernel(uint8_t* flag, const float* I, int64_t n_tok, int64_t n_past, int64_t n_ctx,
                                  int64_t topk) {
  const int64_t idx = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx >= n_tok * n_ctx) return;
  const int64_t i = idx / n_ctx, s = idx % n_ctx, n_vis = n_past + i + 1;
  if (s >= n_vis) {
    flag[idx] = 0;
    return;
  }
  const float* row = I + i * n_ctx;
  const float v = row[s];
  int64_t rank = 0;
  for (int64_t r = 0; r < n_vis && rank < topk; ++r) {
    const float u = row[r];
    rank += (u > v || (u == v && r < s)) ? 1 : 0;
  }
  flag[idx] = rank < topk ? 1 : 0;
}

// One block per query: sel[i, :] = flagged positions ascending, then -1 (all visible ones when n_vis <=
// topk).
constexpr int kScanThreads = 256;
__global__ void index_compact_kernel(int32_t* sel, const uint8_t* flag, int64_t n_past, int64_t n_ctx,
                                     int64_t topk) {
  using Scan = cub::BlockScan<int, kScanThreads>;
  __shared__ typename Scan::TempStorage tmp;
  __shared__ int base;
  const int64_t i = blockIdx.x, n_vis = n_past + i + 1;
  int32_t* out = sel + i * topk;
  for (int64_t j = threadIdx.x; j < topk; j += blockDim.x) out[j] = -1;
  __syncthreads();
  if (n_vis <= topk) {
    for (int64_t s = threadIdx.x; s < n_vis; s += blockDim.x) out[s] = int32_t(s);
    return;
  }
  if (threadIdx.x == 0) base = 0;
  __syncthreads();
  for (int64_t s0 = 0; s0 < n_vis; s0 += blockDim.x) {
    const int64_t s = s0 + threadIdx.x;
    const int f = s < n_vis ? flag[i * n_ctx + s] : 0;
    int pos, total;
    Scan(tmp).ExclusiveSum(f, pos, total);
    if (f && base + pos < topk) out[base + pos] = int32_t(s);
    __syncthreads();
    if (threadIdx.x == 0) base += total;
    __syncthreads();
  }
}

// Trace "dsa_sel" [n_tok, topk] as floats (model/dsa.cpp trace_sel): sel, or every s <= n_past + i (dense).
__global__ void sel_to_float_kernel(float* f, const int32_t* sel, int64_t n_tok, int64_t topk,
                                    int64_t n_past) {
  const int64_t idx = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx >= n_tok * topk) return;
  const int64_t i = idx / topk, s = idx % topk;
  f[idx] = sel ? float(sel[idx]) : (s <= n_past + i ? float(s) : -1.f);
}

Status trace_sel(const GpuCtx& c, int layer, const int32_t* sel, int64_t n_past, int64_t n_tok,
                 int64_t topk) {
  if (!c.trace || !*c.trace) return ok_status();
  DevBuf f;
  K3_RETURN_IF_ERROR(f.alloc(c, n_tok * topk));
  sel_to_float_kernel<<<blocks_for(n_tok * topk), kThreads, 0, c.stream()>>>(f.f(), sel, n_tok, topk, n_past);
  c.cb("dsa_sel", layer, f.f(), n_tok * topk);
  return ok_status();
}

// The DSA ops (paged index keys, tensor-core scores, radix top-k, sparse MLA) serve bf16 mode by default
// since session 4 (ops checked on the H200, and the K3.1 slice's layers = CPU); K3_DSA_FAST=0 (read once)
// keeps the straightforward kernels.
bool dsa_fast_enabled() {
  static const bool on = env_switch("K3_DSA_FAST", true);
  return on;
}

DsaKeyCache key_cache(const PagedRows& keys, int Di) {
  DsaKeyCache kc;
  kc.fmt = DsaKeyFormat::bf16, kc.d_head = Di, kc.page_size = kCachePage, kc.max_pages = keys.max_pages;
  kc.n_pages = keys.n_pages, kc.pages = const_cast<uint16_t*>(keys.pages), kc.block_table = keys.table;
  return kc;
}

// bf16 mode: tensor-core scores over the paged keys (prefill form: every query of one sequence, table row
// 0), radix top-k (see the file comment).
Status select_bf16(const GpuCtx& c, int Hi, int Di, int64_t topk, const float* qI, const float* a,
                   const PagedRows& keys, int64_t n_past, int64_t n_tok, DevBuf* sel) {
  const int64_t n_ctx = n_past + n_tok;
  DevBuf I;
  K3_RETURN_IF_ERROR(I.alloc(c, n_tok * n_ctx));
  K3_RETURN_IF_ERROR(sel->alloc_bytes(c, size_t(n_tok * topk) * 4));
  DsaIndexParams ip;
  ip.cache = key_cache(keys, Di), ip.n_head = Hi, ip.n_q = int(n_tok), ip.n_past = n_past, ip.max_ctx = n_ctx;
  ip.q = qI, ip.w = a, ip.scale = 1.f / std::sqrt(float(Hi * Di)), ip.q_exact = false;
  ip.score = I.f(), ip.ld = n_ctx;
  K3_RETURN_IF_ERROR(dsa_index_check(ip));
  dsa_index_cuda(ip, *c.g);
  DsaTopkParams tp;
  tp.n_row = int(n_tok), tp.topk = int(topk), tp.ld = n_ctx, tp.score = I.f(), tp.len0 = n_past + 1;
  tp.max_len = n_ctx, tp.sel = sel->as<int32_t>();
  K3_RETURN_IF_ERROR(dsa_topk_check(tp));
  dsa_topk_cuda(tp, *c.g);
  return ok_status();
}

}  // namespace

void dsa_keys_gpu(const GpuCtx& c, const ModelConfig& cfg, const DsaWeightsGpu& w, const float* x,
                  int64_t n_tok, float* kI, int layer) {
  const int Di = cfg.dsa.d_head;
  linear(c, w.wk, x, n_tok, kI);
  LayerNormParams ln;
  ln.n_row = n_tok, ln.d = Di, ln.x = kI, ln.y = kI, ln.gain = w.k_norm_w, ln.bias = w.k_norm_b,
  ln.eps = 1e-6f;
  layer_norm_cuda(ln, *c.g);
  c.rnd(kI, n_tok * Di);
  c.cb("dsa_k", layer, kI, n_tok * Di);
}

bool dsa_fast_fits(const GpuCtx& c, const ModelConfig& cfg, const uint16_t* key_pages) {
  const int Hi = cfg.dsa.n_head;
  return c.bf16() && dsa_fast_enabled() && key_pages && Hi >= 1 && Hi <= 64;
}

Status dsa_select_gpu(const GpuCtx& c, const ModelConfig& cfg, const DsaWeightsGpu& w, const float* cq,
                      const float* x, int64_t n_past, int64_t n_tok, const float* index_k,
                      const PagedRows& keys, DevBuf* sel, bool* sparse, int layer) {
  const int Hi = cfg.dsa.n_head, Di = cfg.dsa.d_head;
  const int64_t topk = cfg.dsa.topk, n_ctx = n_past + n_tok;
  *sparse = false;
  if (n_ctx <= topk) {
    K3_RETURN_IF_ERROR(trace_sel(c, layer, nullptr, n_past, n_tok, topk));
    return launch_status("dsa index keys");
  }

  DevBuf qI, a, I, flag;
  K3_RETURN_IF_ERROR(qI.alloc(c, n_tok * Hi * Di));
  K3_RETURN_IF_ERROR(a.alloc(c, n_tok * Hi));
  linear(c, w.wq_b, cq, n_tok, qI.f());
  linear(c, w.weights_proj, x, n_tok, a.f());
  if (dsa_fast_fits(c, cfg, keys.pages)) {
    K3_RETURN_IF_ERROR(select_bf16(c, Hi, Di, topk, qI.f(), a.f(), keys, n_past, n_tok, sel));
    *sparse = true;
    K3_RETURN_IF_ERROR(trace_sel(c, layer, sel->as<int32_t>(), n_past, n_tok, topk));
    return launch_status("dsa select (bf16)");
  }
  K3_RETURN_IF_ERROR(I.alloc(c, n_tok * n_ctx));
  K3_RETURN_IF_ERROR(flag.alloc_bytes(c, size_t(n_tok * n_ctx)));
  K3_RETURN_IF_ERROR(sel->alloc_bytes(c, size_t(n_tok * topk) * 4));
  const float scale = 1.f / std::sqrt(float(Hi * Di));
  index_score_kernel<<<blocks_for(n_tok * n_ctx), kThreads, 0, c.stream()>>>(
      I.f(), qI.f(), a.f(), index_k, n_tok, n_past, n_ctx, Hi, Di, scale);
  index_rank_kernel<<<blocks_for(n_tok * n_ctx), kThreads, 0, c.stream()>>>(flag.as<uint8_t>(), I.f(), n_tok,
                                                                            n_past, n_ctx, topk);
  index_compact_kernel<<<unsigned(n_tok), kScanThreads, 0, c.stream()>>>(
      sel->as<int32_t>(), flag.as<uint8_t>(), n_past, n_ctx, topk);
  *sparse = true;
  K3_RETURN_IF_ERROR(trace_sel(c, layer, sel->as<int32_t>(), n_past, n_tok, topk));
  return launch_status("dsa select");
}

Status dsa_select_rows_gpu(const GpuCtx& c, const ModelConfig& cfg, const DsaWeightsGpu& w, const float* cq,
                           const float* x, int64_t n_rows, const int32_t* ctx, int64_t max_ctx,
                           const PagedRows& keys, DevBuf* sel, int layer) {
  const int Hi = cfg.dsa.n_head, Di = cfg.dsa.d_head;
  const int64_t topk = cfg.dsa.topk;
  DevBuf qI, a, I;
  K3_RETURN_IF_ERROR(qI.alloc(c, n_rows * Hi * Di));
  K3_RETURN_IF_ERROR(a.alloc(c, n_rows * Hi));
  K3_RETURN_IF_ERROR(I.alloc(c, n_rows * max_ctx));
  K3_RETURN_IF_ERROR(sel->alloc_bytes(c, size_t(n_rows * topk) * 4));
  linear(c, w.wq_b, cq, n_rows, qI.f());
  linear(c, w.weights_proj, x, n_rows, a.f());
  DsaIndexParams ip;
  ip.cache = key_cache(keys, Di), ip.n_head = Hi, ip.n_q = int(n_rows), ip.ctx_len = ctx,
  ip.max_ctx = max_ctx;
  ip.q = qI.f(), ip.w = a.f(), ip.scale = 1.f / std::sqrt(float(Hi * Di)), ip.q_exact = false;
  ip.score = I.f(), ip.ld = max_ctx;
  K3_RETURN_IF_ERROR(dsa_index_check(ip));
  dsa_index_cuda(ip, *c.g);
  DsaTopkParams tp;
  tp.n_row = int(n_rows), tp.topk = int(topk), tp.ld = max_ctx, tp.score = I.f(), tp.row_len = ctx;
  tp.max_len = max_ctx, tp.sel = sel->as<int32_t>();
  K3_RETURN_IF_ERROR(dsa_topk_check(tp));
  dsa_topk_cuda(tp, *c.g);
  K3_RETURN_IF_ERROR(trace_sel(c, layer, sel->as<int32_t>(), 0, n_rows, topk));
  return launch_status("dsa select (bf16 rows)");
}

}  // namespace k3::gpu
