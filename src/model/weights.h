// weights.h: every tensor the forward pass reads, bound from a Checkpoint by canonical name
// (docs/tiny-models.md). Matrices are views into the mmapped checkpoint, so the Checkpoint must outlive
// the ModelWeights; small vectors are fp32 copies (binder.h).
#pragma once

#include <memory>
#include <vector>

#include "io/checkpoint.h"
#include "k3/config.h"
#include "model/ffn.h"
#include "model/kda.h"
#include "model/mla.h"
#include "model/moe.h"

namespace k3 {

struct LayerWeights {
  AttnKind kind = AttnKind::kda;
  bool moe = false;
  std::vector<float> input_layernorm;           // [D]
  std::vector<float> post_attention_layernorm;  // [D]
  KdaWeights kda;                               // kind == kda
  MlaWeights mla;                               // kind == mla | dsa
  FfnWeights mlp;                               // dense layers
  MoeWeights moe_w;                             // MoE layers
  std::vector<float> q_attn_res, q_mlp_res;     // [D] AttnRes pseudo-queries (K3; layer 0's q_attn unused)
};

struct ModelWeights {
  const TensorView* embed = nullptr;  // [n_vocab, D] model.embed_tokens.weight
  std::vector<float> norm;            // [D] model.norm.weight
  LinearWeight lm_head;               // [n_vocab, D]
  std::vector<float> q_out_res;       // [D] output AttnRes pseudo-query (K3)
  std::vector<LayerWeights> layers;   // [n_layer]
  std::shared_ptr<void> shard_storage;  // owned copies a sharding transform made (src/dist), if any
};

Result<std::unique_ptr<ModelWeights>> bind_model(const Checkpoint& ckpt);

}  // namespace k3
