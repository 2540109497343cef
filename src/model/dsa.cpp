// dsa.cpp: the DSA lightning indexer (dsa.h, MODEL.md §6).
#include "model/dsa.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "model/parallel.h"

namespace k3 {
namespace {

// Trace "dsa_sel" [n_tok, topk]: the positions the main attention reads per query, as floats, -1 for unused
// (a query with n_vis <= topk reads 0..n_vis-1). Built only when a trace hook is set.
void trace_sel(const Ctx& c, int layer, const std::vector<int32_t>* sel, int64_t n_past, int64_t n_tok,
               int64_t topk) {
  if (!c.trace || !*c.trace) return;
  std::vector<float> f(size_t(n_tok * topk), -1.f);
  for (int64_t i = 0; i < n_tok; ++i)
    for (int64_t s = 0; s < topk; ++s) {
      const int32_t p = sel ? (*sel)[size_t(i * topk + s)] : (s <= n_past + i ? int32_t(s) : -1);
      f[size_t(i * topk + s)] = float(p);
    }
  c.cb("dsa_sel", layer, f.data(), int64_t(f.size()));
}

}  // namespace

Status bind_dsa(Binder& b, const ModelConfig& cfg, DsaWeights* w) {
  const int64_t Hi = cfg.dsa.n_head, Di = cfg.dsa.d_head, D = cfg.d_model;
  w->wq_b = b.linear("indexer.wq_b", Hi * Di, cfg.mla.q_lora_rank);
  w->wk = b.linear("indexer.wk", Di, D);
  w->weights_proj = b.linear("indexer.weights_proj", Hi, D);
  w->k_norm_w = b.vec("indexer.k_norm.weight", Di);
  w->k_norm_b = b.vec("indexer.k_norm.bias", Di);
  return b.status();
}

bool dsa_select(const Ctx& c, const ModelConfig& cfg, const DsaWeights& w, const float* cq, const float* x,
                int64_t n_past, int64_t n_tok, std::vector<float>& index_k, std::vector<int32_t>* sel,
                int layer) {
  const int64_t Di = cfg.dsa.d_head, topk = cfg.dsa.topk;
  std::vector<float> kI;
  linear(c, w.wk, x, n_tok, kI);
  layer_norm(kI.data(), w.k_norm_w.data(), w.k_norm_b.data(), 1e-6f, n_tok, Di, kI.data());
  c.rnd(kI.data(), int64_t(kI.size()));
  c.cb("dsa_k", layer, kI.data(), int64_t(kI.size()));
  index_k.insert(index_k.end(), kI.begin(), kI.end());
  if (n_past + n_tok <= topk) {
    trace_sel(c, layer, nullptr, n_past, n_tok, topk);
    return false;
  }

  // Hi: this rank's index heads (all of them on one rank); the scale counts every head of the model.
  const int64_t Hi = w.weights_proj.out, n_ctx = n_past + n_tok;
  K3_ASSERT(w.wq_b.out == Hi * Di);
  std::vector<float> qI, a;
  linear(c, w.wq_b, cq, n_tok, qI);
  linear(c, w.weights_proj, x, n_tok, a);
  const float scale = 1.f / std::sqrt(float(cfg.dsa.n_head) * float(Di));
  sel->assign(size_t(n_tok * topk), -1);
  const int64_t i0 = std::max<int64_t>(0, topk - n_past);  // queries i >= i0 see more than topk positions
  for (int64_t i = 0; i < std::min(i0, n_tok); ++i)
    for (int64_t s = 0; s <= n_past + i; ++s) (*sel)[size_t(i * topk + s)] = int32_t(s);
  // Scored queries in blocks of rows: I [rows, n_ctx], zero past each row's n_vis, summed over ranks whose
  // index heads are split (head sums are partial), then ranked identically everywhere.
  const int64_t block = std::max<int64_t>(1, (int64_t(1) << 22) / n_ctx);
  std::vector<float> I;
  std::vector<int32_t> idx;
  for (int64_t b0 = i0; b0 < n_tok; b0 += block) {
    const int64_t rows = std::min(block, n_tok - b0);
    I.assign(size_t(rows * n_ctx), 0.f);
    for (int64_t i = b0; i < b0 + rows; ++i) {
      const float* qt = qI.data() + i * Hi * Di;  // a rank may hold no index heads: Hi = 0, empty qI, a
      const float* at = a.data() + i * Hi;
      float* It = &I[size_t((i - b0) * n_ctx)];
      for (int64_t s = 0; s <= n_past + i; ++s) {
        const float* ks = &index_k[size_t(s * Di)];
        float acc = 0.f;
        for (int64_t h = 0; h < Hi; ++h) {
          float d = 0.f;
          for (int64_t e = 0; e < Di; ++e) d += qt[h * Di + e] * ks[e];
          acc += at[h] * std::max(d, 0.f);
        }
        It[s] = acc;
      }
    }
    if (c.par) c.par->reduce_index_scores(c, I.data(), rows * n_ctx);
    for (int64_t i = b0; i < b0 + rows; ++i) {
      const int64_t n_vis = n_past + i + 1;
      float* It = &I[size_t((i - b0) * n_ctx)];
      for (int64_t s = 0; s < n_vis; ++s) It[s] *= scale;
      idx.resize(size_t(n_vis));
      std::iota(idx.begin(), idx.end(), 0);
      std::partial_sort(idx.begin(), idx.begin() + topk, idx.end(),
                        [&](int32_t l, int32_t r) { return It[l] > It[r] || (It[l] == It[r] && l < r); });
      std::sort(idx.begin(), idx.begin() + topk);
      std::copy(idx.begin(), idx.begin() + topk, sel->data() + i * topk);
    }
  }
  trace_sel(c, layer, sel, n_past, n_tok, topk);
  return true;
}

}  // namespace k3
