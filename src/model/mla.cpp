// mla.cpp: gated MLA / DSA attention (mla.h, MODEL.md §5-6).
#include "model/mla.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "model/binder.h"
#include "model/parallel.h"
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
  if (w->kv_b && w->kv_b->dtype != DType::bf16 && w->kv_b->dtype != DType::f16 &&
      w->kv_b->dtype != DType::f32)
    b.fail(error(Code::unsupported, b.prefix() + "kv_b_proj.weight: dtype must be bf16, f16 or f32"));
  w->has_dsa = dsa;
  if (dsa) {
    if (m.q_lora_rank <= 0)
      b.fail(error(Code::bad_file, "DSA layers need q_lora_rank (the indexer reads c^Q)"));
    K3_RETURN_IF_ERROR(b.status());
    K3_RETURN_IF_ERROR(bind_dsa(b, cfg, &w->dsa));
  }
  return b.status();
}

namespace {

// Brings st.kv_exp to the first n_ctx latent rows: rows up to the first one whose latent differs from the
// copy it was expanded from are kept, the rest are expanded: [k_nope_h | v_h] = kv_b_proj c_s, stored per
// head as [k_nope_h | r_s | v_h] (r shared, not rotated). Row results do not depend on which rows are
// expanded together, so the cache changes no value.
void expand_rows(const Ctx& c, const MlaConfig& m, const MlaWeights& w, MlaState& st, int64_t n_ctx) {
  const int64_t nh = m.n_head, R = m.kv_lora_rank, dl = m.d_latent(), wkv = m.d_nope + m.d_v;
  const int64_t wr = m.d_qk() + m.d_v;  // one head of one cached row
  const int64_t n_have = std::min<int64_t>(int64_t(st.kv_src.size()) / dl, n_ctx);
  int64_t p = 0;
  while (p < n_have && std::memcmp(&st.kv_src[size_t(p * dl)], &st.latent[size_t(p * dl)], size_t(dl) * 4) == 0)
    ++p;
  st.kv_exp.resize(size_t(n_ctx * nh * wr));
  st.kv_src.assign(st.latent.begin(), st.latent.begin() + long(n_ctx * dl));
  const int64_t n_new = n_ctx - p;
  if (n_new <= 0) return;
  std::vector<float> lat(size_t(n_new * R)), kvb;
  for (int64_t s = 0; s < n_new; ++s) std::copy_n(&st.latent[size_t((p + s) * dl)], R, &lat[size_t(s * R)]);
  linear(c, w.kv_b_proj, lat.data(), n_new, kvb);  // [n_new, nh * wkv]
  for (int64_t s = 0; s < n_new; ++s)
    for (int64_t h = 0; h < nh; ++h) {
      const float* src = &kvb[size_t((s * nh + h) * wkv)];
      float* dst = &st.kv_exp[size_t(((p + s) * nh + h) * wr)];
      std::copy_n(src, m.d_nope, dst);
      std::copy_n(&st.latent[size_t((p + s) * dl + R)], m.d_rope, dst + m.d_nope);
      std::copy_n(src + m.d_nope, m.d_v, dst + m.d_qk());
    }
}

// Unabsorbed attention of one sequence over the expanded rows; q: [n_tok, nh, d_qk] -> z: [n_tok, nh, d_v].
void attend_unabsorbed(const Ctx& c, const MlaConfig& m, const MlaWeights& w, MlaState& st, AttentionParams p,
                       const float* q, float* z) {
  const int64_t nh = m.n_head, dqk = m.d_qk(), wr = dqk + m.d_v;
  expand_rows(c, m, w, st, p.n_kv);
  p.d_qk = int(dqk), p.d_v = m.d_v;
  p.q = q, p.q_tok_stride = nh * dqk, p.q_head_stride = dqk;
  p.k = st.kv_exp.data(), p.k_tok_stride = nh * wr, p.k_head_stride = wr;
  p.v = st.kv_exp.data() + dqk, p.v_tok_stride = nh * wr, p.v_head_stride = wr;
  p.out = z;
  attention_cpu(p, c.pool);
}

}  // namespace

void mla_forward(const Ctx& c, const ModelConfig& cfg, const MlaWeights& w, std::span<const MlaSeq> seqs,
                 const float* x, int64_t n_tok, float* out, int layer) {
  const MlaConfig& m = cfg.mla;
  const int64_t nh = m.n_head, dqk = m.d_qk(), R = m.kv_lora_rank, dl = m.d_latent(), wkv = m.d_nope + m.d_v;
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
  c.cb("mla_q", layer, q.data(), int64_t(q.size()));
  c.cb("mla_latent", layer, kv.data(), int64_t(kv.size()));

  // Absorbed rows, gathered: q^_h = [W_UK_h^T q_nope_h | q_r_h]  [n_abs, nh, dl]
  std::vector<int64_t> abs_rows;
  for (const MlaSeq& s : seqs)
    if (s.absorbed)
      for (int64_t t = 0; t < s.n_tok; ++t) abs_rows.push_back(s.row0 + t);
  const int64_t n_abs = int64_t(abs_rows.size());
  std::vector<float> qh(size_t(n_abs * nh * dl), 0.f), zh(size_t(n_abs * nh * R));
  if (n_abs > 0) {
    std::vector<float> Wuk(size_t(m.d_nope * R));
    for (int64_t h = 0; h < nh; ++h) {
      read_f32(*w.kv_b, h * wkv * R, m.d_nope * R, Wuk.data());  // rows [h*wkv, h*wkv + d_nope)
      for (int64_t i = 0; i < n_abs; ++i) {
        const float* qn = &q[size_t((abs_rows[size_t(i)] * nh + h) * dqk)];
        float* qa = &qh[size_t((i * nh + h) * dl)];
        for (int64_t a = 0; a < m.d_nope; ++a)
          for (int64_t j = 0; j < R; ++j) qa[j] += qn[a] * Wuk[size_t(a * R + j)];
        std::copy_n(qn + m.d_nope, m.d_rope, qa + R);
      }
    }
    c.rnd(qh.data(), int64_t(qh.size()));  // bf16 mode: q^ in bf16, as the released MLA kernels take it
  }

  std::vector<float> z(size_t(n_tok * nh * m.d_v));
  if (c.par) c.par->mla_context(c, cfg, w, layer, seqs, kv.data(), x, n_tok);
  int64_t abs_i = 0;
  for (const MlaSeq& s : seqs) {
    MlaState& st = *s.st;
    const size_t r0 = size_t(s.row0);
    st.latent.insert(st.latent.end(), kv.begin() + long(r0 * dl), kv.begin() + long((r0 + s.n_tok) * dl));
    std::vector<int32_t> sel;
    bool sparse = false;
    if (w.has_dsa)
      sparse = dsa_select(c, cfg, w.dsa, &cq[r0 * size_t(m.q_lora_rank)], x + s.row0 * cfg.d_model, s.n_past,
                          s.n_tok, st.index_k, &sel, layer);
    AttentionParams p;
    p.n_q = s.n_tok;
    p.n_kv = s.n_past + s.n_tok;
    p.n_head = int(nh);
    p.q_pos0 = s.n_past;
    p.sel = sparse ? sel.data() : nullptr;
    p.n_sel = sparse ? cfg.dsa.topk : 0;
    p.scale = 1.f / std::sqrt(float(dqk));
    if (!s.absorbed) {
      attend_unabsorbed(c, m, w, st, p, &q[r0 * size_t(nh * dqk)], &z[r0 * size_t(nh * m.d_v)]);
      continue;
    }
    // MQA over the latent rows: k = [c | r], v = c. The unabsorbed expansion is not needed any more.
    std::vector<float>().swap(st.kv_exp);
    std::vector<float>().swap(st.kv_src);
    p.d_qk = int(dl), p.d_v = int(R);
    p.q = &qh[size_t(abs_i * nh * dl)], p.q_tok_stride = nh * dl, p.q_head_stride = dl;
    p.k = st.latent.data(), p.k_tok_stride = dl, p.k_head_stride = 0;
    p.v = st.latent.data(), p.v_tok_stride = dl, p.v_head_stride = 0;
    p.out = &zh[size_t(abs_i * nh * R)];
    attention_cpu(p, c.pool);
    abs_i += s.n_tok;
  }
  if (n_abs > 0) {  // z_h = W_UV_h z^_h over all absorbed rows at once
    std::vector<float> xin(size_t(n_abs * R)), zo(size_t(n_abs * m.d_v));
    for (int64_t h = 0; h < nh; ++h) {
      LinearWeight Wuv = w.kv_b_proj;  // rows [h*wkv + d_nope, (h+1)*wkv)
      Wuv.out = m.d_v;
      Wuv.w =
          static_cast<const char*>(w.kv_b_proj.w) + size_t((h * wkv + m.d_nope) * R) * dtype_size(Wuv.dtype);
      for (int64_t i = 0; i < n_abs; ++i) std::copy_n(&zh[size_t((i * nh + h) * R)], R, &xin[size_t(i * R)]);
      linear_into(c, Wuv, xin.data(), n_abs, zo.data(), /*round=*/false, /*x_exact=*/true);
      for (int64_t i = 0; i < n_abs; ++i)
        std::copy_n(&zo[size_t(i * m.d_v)], m.d_v, &z[size_t((abs_rows[size_t(i)] * nh + h) * m.d_v)]);
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
  linear_rowpar(c, w.o_proj, z.data(), n_tok, out);  // a partial sum when the heads are sharded
}

}  // namespace k3
