// weights.cpp: binding a Checkpoint to ModelWeights (weights.h). Fails with the first bad tensor's name.
#include "model/weights.h"

#include "model/attn_res.h"
#include "model/binder.h"

namespace k3 {

namespace {

Status bind_layer(const Checkpoint& ckpt, const ModelConfig& cfg, int i, LayerWeights* w) {
  const int64_t D = cfg.d_model;
  Binder b(ckpt, "model.layers." + std::to_string(i) + ".");
  w->kind = cfg.layer_attn[size_t(i)];
  w->moe = cfg.layer_moe[size_t(i)];
  w->input_layernorm = b.vec("input_layernorm.weight", D);
  w->post_attention_layernorm = b.vec("post_attention_layernorm.weight", D);
  if (cfg.uses_attn_res()) {
    if (i > 0) w->q_attn_res = bind_attn_res_query(b, "self_attention_res", D);
    w->q_mlp_res = bind_attn_res_query(b, "mlp_res", D);
  }
  K3_RETURN_IF_ERROR(b.status());
  Binder ba(ckpt, b.prefix() + "self_attn.");
  if (w->kind == AttnKind::kda)
    K3_RETURN_IF_ERROR(bind_kda(ba, cfg, &w->kda));
  else
    K3_RETURN_IF_ERROR(bind_mla(ba, cfg, w->kind == AttnKind::dsa, &w->mla));
  if (w->moe) {
    Binder bm(ckpt, b.prefix() + "block_sparse_moe.");
    K3_RETURN_IF_ERROR(bind_moe(bm, cfg, &w->moe_w));
  } else {
    Binder bm(ckpt, b.prefix() + "mlp.");
    K3_RETURN_IF_ERROR(bind_ffn(bm, "gate_proj", "up_proj", "down_proj", D, cfg.d_ff, &w->mlp));
  }
  return ok_status();
}

}  // namespace

Result<std::unique_ptr<ModelWeights>> bind_model(const Checkpoint& ckpt) {
  const ModelConfig& cfg = ckpt.config();
  if (int(cfg.layer_attn.size()) != cfg.n_layer || int(cfg.layer_moe.size()) != cfg.n_layer ||
      cfg.n_layer <= 0)
    return error(Code::bad_file, "config: layer lists do not cover num_hidden_layers");
  if (cfg.uses_attn_res() && cfg.attn_res_block_size <= 0)
    return error(Code::bad_file, "config: attn_res_block_size must be positive");
  auto w = std::make_unique<ModelWeights>();
  Binder b(ckpt, "");
  w->embed = b.tensor("model.embed_tokens.weight");
  w->norm = b.vec("model.norm.weight", cfg.d_model);
  w->lm_head = b.linear("lm_head", cfg.n_vocab, cfg.d_model);
  if (cfg.uses_attn_res()) w->q_out_res = bind_attn_res_query(b, "model.output_attn_res", cfg.d_model);
  K3_RETURN_IF_ERROR(b.status());
  const TensorView& e = *w->embed;
  if (e.ndim() != 2 || e.dim(0) != cfg.n_vocab || e.dim(1) != cfg.d_model ||
      (e.dtype != DType::bf16 && e.dtype != DType::f16 && e.dtype != DType::f32))
    return error(Code::bad_file, "bad tensor model.embed_tokens.weight: " + describe(e));
  w->layers.resize(size_t(cfg.n_layer));
  for (int i = 0; i < cfg.n_layer; ++i) K3_RETURN_IF_ERROR(bind_layer(ckpt, cfg, i, &w->layers[size_t(i)]));
  return w;
}

}  // namespace k3
