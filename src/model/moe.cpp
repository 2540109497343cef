// moe.cpp: routed MoE (moe.h, MODEL.md §8.2-8.3).
#include "model/moe.h"

#include <algorithm>
#include <numeric>

#include "model/parallel.h"

namespace k3 {

Status bind_moe(Binder& b, const ModelConfig& cfg, MoeWeights* w) {
  const MoeConfig& m = cfg.moe;
  const int64_t D = cfg.d_model, E = m.n_expert;
  if (m.n_expert_group != 1 || m.topk_group != 1)
    return error(Code::unsupported, "grouped top-k with num_expert_group/topk_group other than 1/1");
  if (m.n_expert_used <= 0 || m.n_expert_used > E) return error(Code::bad_file, "bad num_experts_per_token");
  w->gate = b.linear("gate", E, D);
  w->bias = b.vec("gate.e_score_correction_bias", E);
  if (m.n_shared_expert > 0)
    K3_RETURN_IF_ERROR(bind_ffn(b, "shared_experts.gate_proj", "shared_experts.up_proj",
                                "shared_experts.down_proj", D, int64_t(m.n_shared_expert) * m.d_ff_expert,
                                &w->shared));
  const int64_t d_in = m.d_latent > 0 ? m.d_latent : D;
  if (m.d_latent > 0) {
    w->latent_down = b.linear("routed_expert_down_proj", m.d_latent, D);
    if (m.latent_norm) w->latent_norm = b.vec("routed_expert_norm.weight", m.d_latent);
    w->latent_up = b.linear("routed_expert_up_proj", D, m.d_latent);
  }
  w->experts.resize(size_t(E));
  for (int64_t e = 0; e < E; ++e) {
    const std::string p = "experts." + std::to_string(e) + ".";
    K3_RETURN_IF_ERROR(bind_ffn(b, (p + "w1").c_str(), (p + "w3").c_str(), (p + "w2").c_str(), d_in,
                                m.d_ff_expert, &w->experts[size_t(e)]));
  }
  return b.status();
}

void moe_route(const ModelConfig& cfg, const float* s, const float* bias, int32_t* sel, float* weight) {
  const int E = cfg.moe.n_expert, k = cfg.moe.n_expert_used;
  std::vector<int32_t> idx(static_cast<size_t>(E));
  std::iota(idx.begin(), idx.end(), 0);
  std::partial_sort(idx.begin(), idx.begin() + k, idx.end(), [&](int32_t a, int32_t b) {
    const float ca = s[a] + bias[a], cb = s[b] + bias[b];
    return ca > cb || (ca == cb && a < b);
  });
  float sum = 0.f;
  for (int j = 0; j < k; ++j) sum += s[idx[size_t(j)]];
  for (int j = 0; j < k; ++j) {
    sel[j] = idx[size_t(j)];
    const float sj = s[sel[j]];
    weight[j] = (cfg.moe.renormalize ? sj / (sum + 1e-20f) : sj) * cfg.moe.routed_scaling_factor;
  }
}

void moe_forward(const Ctx& c, const ModelConfig& cfg, const MoeWeights& w, const float* x, int64_t n_tok,
                 float* out, int layer) {
  const MoeConfig& m = cfg.moe;
  const int64_t D = cfg.d_model, E = m.n_expert, k = m.n_expert_used;
  const int64_t dz = m.d_latent > 0 ? m.d_latent : D;
  std::vector<float> s(size_t(n_tok * E)), wt(size_t(n_tok * k));
  std::vector<int32_t> sel(size_t(n_tok * k));
  linear_into(c, w.gate, x, n_tok, s.data(), /*round=*/false);
  c.cb("moe_logits", layer, s.data(), int64_t(s.size()));
  for (float& v : s) v = sigmoidf(v);
  for (int64_t t = 0; t < n_tok; ++t)
    moe_route(cfg, &s[size_t(t * E)], w.bias.data(), &sel[size_t(t * k)], &wt[size_t(t * k)]);
  if (c.tracing()) {  // each token's set of chosen experts (ascending, as floats): a routing flip shows here
    std::vector<float> f(sel.begin(), sel.end());
    for (int64_t t = 0; t < n_tok; ++t) std::sort(f.begin() + t * k, f.begin() + (t + 1) * k);
    c.cb("moe_sel", layer, f.data(), int64_t(f.size()));
  }
  c.cb("moe_weights", layer, wt.data(), int64_t(wt.size()));

  std::vector<float> z;
  if (m.d_latent > 0) linear(c, w.latent_down, x, n_tok, z);
  const float* zin = m.d_latent > 0 ? z.data() : x;

  // Each expert runs on the tokens routed to it; results land in (token, slot) rows, summed in slot order.
  std::vector<float> slot_out(size_t(n_tok * k * dz)), xe, ye;
  std::vector<int64_t> rows;
  const bool dispatched =
      c.par && c.par->moe_experts(c, cfg, w, zin, sel.data(), n_tok, slot_out.data(), layer);
  for (int64_t e = 0; e < (dispatched ? 0 : E); ++e) {
    rows.clear();
    for (int64_t r = 0; r < n_tok * k; ++r)
      if (sel[size_t(r)] == e) rows.push_back(r);
    if (rows.empty()) continue;
    xe.resize(rows.size() * size_t(dz));
    ye.resize(rows.size() * size_t(dz));
    for (size_t i = 0; i < rows.size(); ++i) std::copy_n(zin + (rows[i] / k) * dz, dz, &xe[i * size_t(dz)]);
    ffn_forward(c, cfg, w.experts[size_t(e)], xe.data(), int64_t(rows.size()), ye.data());
    for (size_t i = 0; i < rows.size(); ++i)
      std::copy_n(&ye[i * size_t(dz)], dz, &slot_out[size_t(rows[i] * dz)]);
  }
  std::vector<float> y(size_t(n_tok * dz), 0.f);
  for (int64_t t = 0; t < n_tok; ++t)
    for (int64_t j = 0; j < k; ++j) {
      const float wj = wt[size_t(t * k + j)];
      const float* src = &slot_out[size_t((t * k + j) * dz)];
      float* dst = &y[size_t(t * dz)];
      for (int64_t i = 0; i < dz; ++i) dst[i] += wj * src[i];
    }
  c.rnd(y.data(), int64_t(y.size()));
  std::vector<float> routed;
  if (m.d_latent > 0) {
    if (m.latent_norm) rms_norm(c, y.data(), w.latent_norm.data(), cfg.rms_norm_eps, n_tok, dz, y.data());
    linear(c, w.latent_up, y.data(), n_tok, routed);
  } else {
    routed.swap(y);
  }
  c.cb("moe_routed", layer, routed.data(), int64_t(routed.size()));
  if (m.n_shared_expert > 0) {
    ffn_forward(c, cfg, w.shared, x, n_tok, out);
    c.cb("moe_shared", layer, out, n_tok * D);
  } else {
    std::fill(out, out + n_tok * D, 0.f);
  }
  for (int64_t i = 0; i < n_tok * D; ++i) out[i] += routed[size_t(i)];
  c.rnd(out, n_tok * D);
}

}  // namespace k3
