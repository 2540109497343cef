// model.cpp: the layer loop (model.h, MODEL.md §2, §7, §10).
#include "model/model.h"

#include <algorithm>

#include "core/thread_pool.h"
#include "model/attn_res.h"
#include "model/batch.h"
#include "model/binder.h"
#include "model/common.h"
#include "model/weights.h"

namespace k3 {

Model::Model(const Checkpoint& ckpt, const ModelOptions& opt, std::unique_ptr<ModelConfig> shard_cfg)
    : shard_cfg_(std::move(shard_cfg)), cfg_(shard_cfg_ ? *shard_cfg_ : ckpt.config()), opt_(opt) {}
Model::~Model() = default;

bool Model::activation_checks_enabled() {
#ifdef NDEBUG
  return false;
#else
  return true;
#endif
}

Result<std::unique_ptr<Model>> Model::load(const Checkpoint& ckpt, const ModelOptions& opt) {
  return load(ckpt, opt, nullptr);
}

Result<std::unique_ptr<Model>> Model::load(const Checkpoint& ckpt, const ModelOptions& opt,
                                           const WeightTransform& shard) {
  if (opt.kda_chunk <= 0) return error(Code::invalid_argument, "kda_chunk must be positive");
  K3_ASSIGN_OR_RETURN(auto w, bind_model(ckpt));
  std::unique_ptr<ModelConfig> cfg;
  if (shard) {
    cfg = std::make_unique<ModelConfig>(ckpt.config());
    K3_RETURN_IF_ERROR(shard(*cfg, *w));
  }
  std::unique_ptr<Model> m(new Model(ckpt, opt, std::move(cfg)));
  m->w_ = std::move(w);
  m->pool_ = std::make_unique<ThreadPool>(opt.n_threads);
  return m;
}

std::unique_ptr<SeqState> Model::new_state() const {
  return std::make_unique<SeqState>(cfg_);
}

Status Model::run(std::span<SeqState* const> states, const int32_t* tokens, std::span<const int64_t> row0,
                  std::span<const int64_t> out_rows, float* logits) {
  const int64_t D = cfg_.d_model, V = cfg_.n_vocab, n_seq = int64_t(states.size()), n_tok = row0.back();
  Status guard;
  Ctx c;
  c.prec = opt_.precision;
  c.pool = pool_.get();
  c.trace = &opt_.trace;
  c.guard = &guard;
  c.par = opt_.parallel;
  KdaExec kx;
  kx.recurrent = opt_.kda_recurrent;
  kx.chunk = opt_.kda_chunk;
  const float eps = cfg_.rms_norm_eps;

  // x0 = embed_tokens[id] (bf16 values are exact in fp32)
  std::vector<float> p(size_t(n_tok * D)), a(p.size()), h(p.size()), o(p.size());
  for (int64_t t = 0; t < n_tok; ++t) read_f32(*w_->embed, int64_t(tokens[t]) * D, D, &p[size_t(t * D)]);
  c.cb("embd", -1, p.data(), int64_t(p.size()));

  std::vector<KdaSeq> kseq(static_cast<size_t>(n_seq));
  std::vector<MlaSeq> mseq(static_cast<size_t>(n_seq));
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
    if (ar && l > 0)
      mix(lw.q_attn_res, a.data());
    else
      a = p;
    if (fresh) B.push_back(p);
    rms_norm(c, a.data(), lw.input_layernorm.data(), eps, n_tok, D, h.data());
    c.cb("attn_norm", l, h.data(), int64_t(h.size()));
    for (int64_t i = 0; i < n_seq; ++i) {
      const int64_t r = row0[size_t(i)], n = row0[size_t(i) + 1] - r;
      kseq[size_t(i)] = {&states[size_t(i)]->kda[size_t(l)], r, n};
      const bool absorbed = opt_.mla == MlaPath::absorbed || (opt_.mla == MlaPath::auto_ && n == 1);
      mseq[size_t(i)] = {&states[size_t(i)]->mla[size_t(l)], r, n, states[size_t(i)]->n_past_, absorbed};
    }
    if (lw.kind == AttnKind::kda)
      kda_forward(c, cfg_, lw.kda, kx, kseq, h.data(), n_tok, o.data(), l);
    else
      mla_forward(c, cfg_, lw.mla, mseq, h.data(), n_tok, o.data(), l);
    c.cb("attn_out", l, o.data(), int64_t(o.size()));
    if (fresh) {
      p = o;
    } else {
      for (size_t i = 0; i < p.size(); ++i) p[i] += o[i];
      c.rnd(p.data(), int64_t(p.size()));
    }
    // FFN sub-layer
    if (ar)
      mix(lw.q_mlp_res, a.data());
    else
      a = p;
    rms_norm(c, a.data(), lw.post_attention_layernorm.data(), eps, n_tok, D, h.data());
    c.cb("ffn_norm", l, h.data(), int64_t(h.size()));
    if (lw.moe)
      moe_forward(c, cfg_, lw.moe_w, h.data(), n_tok, o.data(), l);
    else
      ffn_forward(c, cfg_, lw.mlp, h.data(), n_tok, o.data());
    c.cb("ffn_out", l, o.data(), int64_t(o.size()));
    for (size_t i = 0; i < p.size(); ++i) p[i] += o[i];
    c.rnd(p.data(), int64_t(p.size()));
    c.cb("l_out", l, p.data(), int64_t(p.size()));
    if (!guard.ok()) return guard;
  }
  if (ar)
    mix(w_->q_out_res, a.data());
  else
    a = p;
  for (int64_t i = 0; i < n_seq; ++i) states[size_t(i)]->n_past_ += row0[size_t(i) + 1] - row0[size_t(i)];

  // logits = lm_head RMSNorm(h; model.norm), fp32 output, only for the requested rows
  const int64_t n_out = int64_t(out_rows.size());
  for (int64_t i = 0; i < n_out; ++i) std::copy_n(&a[size_t(out_rows[size_t(i)] * D)], D, &o[size_t(i * D)]);
  rms_norm(c, o.data(), w_->norm.data(), eps, n_out, D, h.data());
  c.cb("result_norm", cfg_.n_layer, h.data(), n_out * D);
  if (logits) {
    linear_into(c, w_->lm_head, h.data(), n_out, logits, /*round=*/false);
    c.cb("result_output", cfg_.n_layer, logits, n_out * V);
  }
  return guard;
}

Status Model::forward(SeqState& state, const int32_t* tokens, int64_t n_tok, std::vector<float>* logits,
                      bool all_logits) {
  K3_RETURN_IF_ERROR(check_tokens(tokens, n_tok, cfg_.n_vocab));
  if (n_tok <= 0) {
    if (logits) logits->clear();
    return ok_status();
  }
  SeqState* states[1] = {&state};
  const int64_t row0[2] = {0, n_tok};
  std::vector<int64_t> out_rows;
  for (int64_t t = all_logits ? 0 : n_tok - 1; t < n_tok; ++t) out_rows.push_back(t);
  if (logits) logits->resize(out_rows.size() * size_t(cfg_.n_vocab));
  return run(states, tokens, row0, out_rows, logits ? logits->data() : nullptr);
}

Status Model::forward_packed(std::span<SeqState* const> states, const int32_t* tokens,
                             std::span<const int64_t> row0, std::span<const int64_t> out_rows,
                             std::vector<float>* logits) {
  if (row0.size() != states.size() + 1 || row0.empty() || row0[0] != 0)
    return error(Code::invalid_argument, "forward_packed: row0 must hold one start per sequence and the end");
  for (size_t i = 0; i < states.size(); ++i)
    if (row0[i + 1] <= row0[i]) return error(Code::invalid_argument, "forward_packed: empty sequence");
  for (size_t i = 0; i < out_rows.size(); ++i)
    if (out_rows[i] < 0 || out_rows[i] >= row0.back() || (i > 0 && out_rows[i] <= out_rows[i - 1]))
      return error(Code::invalid_argument, "forward_packed: out_rows must be ascending rows");
  K3_RETURN_IF_ERROR(check_tokens(tokens, row0.back(), cfg_.n_vocab));
  if (states.empty()) return ok_status();
  std::vector<float> tmp;
  std::vector<float>& out = logits ? *logits : tmp;
  out.resize(out_rows.size() * size_t(cfg_.n_vocab));
  return run(states, tokens, row0, out_rows, out.data());
}

Status Model::forward_batch(std::span<SeqState*> states, std::span<const std::span<const int32_t>> tokens,
                            std::vector<std::vector<float>>* last_logits) {
  PackedBatch<SeqState> b;
  K3_RETURN_IF_ERROR(pack_batch(states, tokens, cfg_.n_vocab, &b));
  std::vector<float> logits(b.out_rows.size() * size_t(cfg_.n_vocab));
  if (!b.live.empty()) K3_RETURN_IF_ERROR(run(b.live, b.tokens.data(), b.row0, b.out_rows, logits.data()));
  if (last_logits) unpack_last_logits(tokens, logits.data(), cfg_.n_vocab, last_logits, pool_.get());
  return ok_status();
}

}  // namespace k3
