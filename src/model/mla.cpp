// mla.cpp: gated MLA / DSA attention (mla.h, MODEL.md §5-6).
#include "model/mla.h"

#include <cmath>

#include "model/binder.h"
#include "ops/attention.h"

namespace k3 {

Status bind_mla(Binder& b, const ModelConfig& cfg, bool dsa, MlaWeights* w) {
  const MlaConfig& m = cfg.mla;
  const int64_t D = cfg.d_model, nh = m.n_head;
  if (m.q_lora_rank > 0) {
    w->q_a_proj = b.linear("q_a_proj", m.q_lora_rank, D);
    w->q_a_layernorm = b.vec("q_a_layernorm.weight", m.q_lora_rank);
    w->q_b_proj = b.linear("q_b_proj", nh * m.d_qk(), m.q_lora_rank);
  } else {
    w->q_proj = b.linear("q_proj", nh * m.d_qk(), D);
  }
  w->kv_a_proj_with_mqa = b.linear("kv_a_proj_with_mqa", m.d_latent(), D);
  w->kv_a_layernorm = b.vec("kv_a_layernorm.weight", m.kv_lora_rank);
  w->kv_b_proj = b.linear("kv_b_proj", nh * (m.d_nope + m.d_v), m.kv_lora_rank);
  w->kv_b = b.tensor("kv_b_proj.weight");
  w->o_proj = b.linear("o_proj", D, nh * m.d_v);
  if (m.use_output_gate) w->g_proj = b.linear("g_proj", nh * m.d_v, D);
  if (w->kv_b && w->kv_b->dtype != DType::bf16 && w->kv_b->dtype != DType::f16 && w->kv_b->dtype != DType::f32)
    b.fail(error(Code::unsupported, b.prefix() + "kv_b_proj.weight: dtype must be bf16, f16 or f32"));
  w->has_dsa = dsa;
  if (dsa) {
    if (m.q_lora_rank <= 0) b.fail(error(Code::bad_file, "DSA layers need q_lora_rank (the indexer reads c^Q)"));
    K3_RETURN_IF_ERROR(b.status());
    K3_RETURN_IF_ERROR(bind_dsa(b, cfg, &w->dsa));
  }
  return b.status();
}

void mla_forward(const Ctx& c, const ModelConfig& cfg, const MlaWeights& w, bool absorbed, MlaState& st,
                 int64_t n_past, const float* x, int64_t n_tok, float* out, int layer) {
  const MlaConfig& m = cfg.mla;
  const int64_t nh = m.n_head, dqk = m.d_qk(), R = m.kv_lora_rank, dl = m.d_latent();
  const int64_t n_ctx = n_past + n_tok;
  std::vector<float> q, cq, kv;
  if (m.q_lora_rank > 0) {
    linear(c, w.q_a_proj, x, n_tok, cq);
    rms_norm(c, cq.data(), w.q_a_layernorm.data(), 1e-6f, n_tok, m.q_lora_rank, cq.data());
    linear(c, w.q_b_proj, cq.data(), n_tok, q);
  } else {
    linear(c, w.q_proj, x, n_tok, q);
  }
  linear(c, w.kv_a_proj_with_mqa, x, n_tok, kv);  // [n_tok, R + d_rope]
  for (int64_t t = 0; t < n_tok; ++t)
    rms_norm(c, &kv[size_t(t * dl)], w.kv_a_layernorm.data(), 1e-6f, 1, R, &kv[size_t(t * dl)]);
  st.latent.insert(st.latent.end(), kv.begin(), kv.end());
  c.cb("mla_q", layer, q.data(), int64_t(q.size()));
  c.cb("mla_latent", layer, kv.data(), int64_t(kv.size()));

  std::vector<int32_t> sel;
  bool sparse = false;
  if (w.has_dsa) sparse = dsa_select(c, cfg, w.dsa, cq.data(), x, n_past, n_tok, st.index_k, &sel, layer);

  AttentionParams p;
  p.n_q = n_tok;
  p.n_kv = n_ctx;
  p.n_head = int(nh);
  p.q_pos0 = n_past;
  p.sel = sparse ? sel.data() : nullptr;
  p.n_sel = sparse ? cfg.dsa.topk : 0;
  p.scale = 1.f / std::sqrt(float(dqk));
  std::vector<float> z(size_t(n_tok * nh * m.d_v));
  if (!absorbed) {
    // Expand every cached row: [k_nope_h | v_h] = kv_b_proj c_s; k_h = [k_nope_h | r_s].
    std::vector<float> lat(size_t(n_ctx * R)), kvb, K(size_t(n_ctx * nh * dqk));
    for (int64_t s = 0; s < n_ctx; ++s)
      std::copy_n(&st.latent[size_t(s * dl)], R, &lat[size_t(s * R)]);
    linear(c, w.kv_b_proj, lat.data(), n_ctx, kvb);  // [n_ctx, nh * (d_nope + d_v)]
    const int64_t wkv = m.d_nope + m.d_v;
    for (int64_t s = 0; s < n_ctx; ++s)
      for (int64_t h = 0; h < nh; ++h) {
        float* k = &K[size_t((s * nh + h) * dqk)];
        std::copy_n(&kvb[size_t(s * nh * wkv + h * wkv)], m.d_nope, k);
        std::copy_n(&st.latent[size_t(s * dl + R)], m.d_rope, k + m.d_nope);
      }
    p.d_qk = int(dqk), p.d_v = m.d_v;
    p.q = q.data(), p.q_tok_stride = nh * dqk, p.q_head_stride = dqk;
    p.k = K.data(), p.k_tok_stride = nh * dqk, p.k_head_stride = dqk;
    p.v = kvb.data() + m.d_nope, p.v_tok_stride = nh * wkv, p.v_head_stride = wkv;
    p.out = z.data();
    attention_cpu(p, c.pool);
  } else {
    // q^_h = [W_UK_h^T q_nope_h | q_r_h]; MQA over the latent rows; z_h = W_UV_h z^_h.
    const int64_t wkv = m.d_nope + m.d_v;
    std::vector<float> qh(size_t(n_tok * nh * dl), 0.f), zh(size_t(n_tok * nh * R)), Wuk(size_t(m.d_nope * R));
    for (int64_t h = 0; h < nh; ++h) {
      read_f32(*w.kv_b, h * wkv * R, m.d_nope * R, Wuk.data());  // rows [h*wkv, h*wkv + d_nope)
      for (int64_t t = 0; t < n_tok; ++t) {
        const float* qn = &q[size_t((t * nh + h) * dqk)];
        float* qa = &qh[size_t((t * nh + h) * dl)];
        for (int64_t i = 0; i < m.d_nope; ++i)
          for (int64_t j = 0; j < R; ++j) qa[j] += qn[i] * Wuk[size_t(i * R + j)];
        std::copy_n(qn + m.d_nope, m.d_rope, qa + R);
      }
    }
    p.d_qk = int(dl), p.d_v = int(R);
    p.q = qh.data(), p.q_tok_stride = nh * dl, p.q_head_stride = dl;
    p.k = st.latent.data(), p.k_tok_stride = dl, p.k_head_stride = 0;
    p.v = st.latent.data(), p.v_tok_stride = dl, p.v_head_stride = 0;
    p.out = zh.data();
    attention_cpu(p, c.pool);
    std::vector<float> xin(size_t(n_tok * R)), zo(size_t(n_tok * m.d_v));
    for (int64_t h = 0; h < nh; ++h) {
      LinearWeight Wuv = w.kv_b_proj;  // rows [h*wkv + d_nope, (h+1)*wkv)
      Wuv.out = m.d_v;
      Wuv.w = static_cast<const char*>(w.kv_b_proj.w) + size_t((h * wkv + m.d_nope) * R) * dtype_size(Wuv.dtype);
      for (int64_t t = 0; t < n_tok; ++t) std::copy_n(&zh[size_t((t * nh + h) * R)], R, &xin[size_t(t * R)]);
      linear_into(c, Wuv, xin.data(), n_tok, zo.data(), /*round=*/false, /*x_exact=*/true);
      for (int64_t t = 0; t < n_tok; ++t) std::copy_n(&zo[size_t(t * m.d_v)], m.d_v, &z[size_t((t * nh + h) * m.d_v)]);
    }
  }
  c.rnd(z.data(), int64_t(z.size()));
  c.cb("mla_z", layer, z.data(), int64_t(z.size()));
  if (m.use_output_gate) {
    std::vector<float> g;
    linear(c, w.g_proj, x, n_tok, g);
    for (size_t i = 0; i < z.size(); ++i) z[i] *= sigmoidf(g[i]);
    c.rnd(z.data(), int64_t(z.size()));
  }
  linear_into(c, w.o_proj, z.data(), n_tok, out);
}

}  // namespace k3
