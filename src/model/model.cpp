// model.cpp: the layer loop (model.h, MODEL.md §2, §7, §10).
#include "model/model.h"

#include <algorithm>

#include "core/thread_pool.h"
#include "model/attn_res.h"
#include "model/binder.h"
#include "model/common.h"
#include "model/weights.h"

namespace k3 {

Model::Model(const Checkpoint& ckpt, const ModelOptions& opt) : cfg_(ckpt.config()), opt_(opt) {}
Model::~Model() = default;

Result<std::unique_ptr<Model>> Model::load(const Checkpoint& ckpt, const ModelOptions& opt) {
  if (opt.kda_chunk <= 0) return error(Code::invalid_argument, "kda_chunk must be positive");
  K3_ASSIGN_OR_RETURN(auto w, bind_model(ckpt));
  std::unique_ptr<Model> m(new Model(ckpt, opt));
  m->w_ = std::move(w);
  m->pool_ = std::make_unique<ThreadPool>(opt.n_threads);
  return m;
}

std::unique_ptr<SeqState> Model::new_state() const { return std::make_unique<SeqState>(cfg_); }

Status Model::forward(SeqState& state, const int32_t* tokens, int64_t n_tok, std::vector<float>* logits,
                      bool all_logits) {
  const int64_t D = cfg_.d_model, V = cfg_.n_vocab;
  for (int64_t t = 0; t < n_tok; ++t)
    if (tokens[t] < 0 || tokens[t] >= V)
      return error(Code::invalid_argument, "token id " + std::to_string(tokens[t]) + " at position " +
                                               std::to_string(t) + " is outside [0, " + std::to_string(V) + ")");
  if (n_tok <= 0) {
    if (logits) logits->clear();
    return ok_status();
  }
  Status guard;
  Ctx c;
  c.prec = opt_.precision;
  c.pool = pool_.get();
  c.trace = &opt_.trace;
  c.guard = &guard;
  const bool absorbed = opt_.mla == MlaPath::absorbed || (opt_.mla == MlaPath::auto_ && n_tok == 1);
  KdaExec kx;
  kx.recurrent = opt_.kda_recurrent || n_tok == 1;
  kx.chunk = opt_.kda_chunk;
  const int64_t n_past = state.n_past_;
  const float eps = cfg_.rms_norm_eps;

  // x0 = embed_tokens[id] (bf16 values are exact in fp32)
  std::vector<float> p(size_t(n_tok * D)), a(p.size()), h(p.size()), o(p.size());
  for (int64_t t = 0; t < n_tok; ++t) read_f32(*w_->embed, int64_t(tokens[t]) * D, D, &p[size_t(t * D)]);
  c.cb("embd", -1, p.data(), int64_t(p.size()));

  std::vector<std::vector<float>> B;  // AttnRes: finished block sums (bf16), [n_tok, D] each
  auto mix = [&](const std::vector<float>& q, float* out) {
    std::vector<const float*> src;
    for (const auto& b : B) src.push_back(b.data());
    src.push_back(p.data());
    attn_res_mix(c, src, q.data(), eps, n_tok, D, out);
  };
  const bool ar = cfg_.uses_attn_res();
  for (int l = 0; l < cfg_.n_layer; ++l) {
    const LayerWeights& lw = w_->layers[size_t(l)];
    // attention sub-layer
    const bool fresh = ar && l % cfg_.attn_res_block_size == 0;
    if (ar && l > 0) mix(lw.q_attn_res, a.data());
    else a = p;
    if (fresh) B.push_back(p);
    rms_norm(c, a.data(), lw.input_layernorm.data(), eps, n_tok, D, h.data());
    c.cb("attn_norm", l, h.data(), int64_t(h.size()));
    if (lw.kind == AttnKind::kda)
      kda_forward(c, cfg_, lw.kda, kx, state.kda[size_t(l)], h.data(), n_tok, o.data(), l);
    else
      mla_forward(c, cfg_, lw.mla, absorbed, state.mla[size_t(l)], n_past, h.data(), n_tok, o.data(), l);
    c.cb("attn_out", l, o.data(), int64_t(o.size()));
    if (fresh) {
      p = o;
    } else {
      for (size_t i = 0; i < p.size(); ++i) p[i] += o[i];
      c.rnd(p.data(), int64_t(p.size()));
    }
    // FFN sub-layer
    if (ar) mix(lw.q_mlp_res, a.data());
    else a = p;
    rms_norm(c, a.data(), lw.post_attention_layernorm.data(), eps, n_tok, D, h.data());
    c.cb("ffn_norm", l, h.data(), int64_t(h.size()));
    if (lw.moe) moe_forward(c, cfg_, lw.moe_w, h.data(), n_tok, o.data(), l);
    else ffn_forward(c, cfg_, lw.mlp, h.data(), n_tok, o.data());
    c.cb("ffn_out", l, o.data(), int64_t(o.size()));
    for (size_t i = 0; i < p.size(); ++i) p[i] += o[i];
    c.rnd(p.data(), int64_t(p.size()));
    c.cb("l_out", l, p.data(), int64_t(p.size()));
    if (!guard.ok()) return guard;
  }
  if (ar) mix(w_->q_out_res, a.data());
  else a = p;
  state.n_past_ = n_past + n_tok;

  // logits = lm_head RMSNorm(h; model.norm), fp32 output
  const int64_t n_out = all_logits ? n_tok : 1;
  const float* rows = a.data() + (n_tok - n_out) * D;
  rms_norm(c, rows, w_->norm.data(), eps, n_out, D, h.data());
  c.cb("result_norm", cfg_.n_layer, h.data(), n_out * D);
  if (logits) {
    logits->resize(size_t(n_out * V));
    linear_into(c, w_->lm_head, h.data(), n_out, logits->data(), /*round=*/false);
    c.cb("result_output", cfg_.n_layer, logits->data(), n_out * V);
  }
  return guard;
}

Status Model::forward_batch(std::span<SeqState*> states, std::span<const std::span<const int32_t>> tokens,
                            std::vector<std::vector<float>>* last_logits) {
  if (states.size() != tokens.size())
    return error(Code::invalid_argument, "forward_batch: " + std::to_string(states.size()) + " states but " +
                                             std::to_string(tokens.size()) + " token spans");
  if (last_logits) last_logits->assign(states.size(), {});
  for (size_t i = 0; i < states.size(); ++i) {
    Status s = forward(*states[i], tokens[i].data(), int64_t(tokens[i].size()),
                       last_logits ? &(*last_logits)[i] : nullptr, false);
    if (!s.ok()) return s.with_context("sequence " + std::to_string(i));
  }
  return ok_status();
}

}  // namespace k3
