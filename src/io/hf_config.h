// hf_config.h: config.json -> a validated k3::ModelConfig (MODEL.md §1-2, §6, §8-9).
//
// Family:  model_type "kimi_linear" (flat keys)                      -> Family::kimi_linear
//          model_type "kimi_k3", keys under text_config              -> Family::k3
//          as K3 with text_config.dsa_config                         -> Family::k3_1
// Layers (config lists are 1-based):  kda(i) = (i+1) in linear_attn_config.kda_layers,
//          mla(i) = (i+1) in full_attn_layers (DSA in K3.1); every layer in exactly one list.
//          moe(i) = i >= first_k_dense_replace && i % moe_layer_freq == 0.
// Rejected (Code::unsupported, message names the key and the reason): num_expert_group/topk_group != 1,
//   router activation other than sigmoid, topk_method other than noaux_tc, index_topk_freq != 1,
//   dsa_layers != full_attn_layers, index_k_norm_type != layernorm, any missing dsa_config key,
//   tie_word_embeddings true, num_nextn_predict_layers > 0, hidden_act not silu/situ, mla_use_nope false,
//   a quantization other than compressed-tensors mxfp4-pack-quantized (group 32, 4-bit float).
// Logged and ignored: dsa_config.index_skip_topk_offset, head_dim, rope keys.
// kda.gate_rank stays 0 here: Checkpoint::open derives it from f_a_proj.weight.
#pragma once

#include <string>
#include <string_view>

#include "core/status.h"
#include "k3/config.h"

namespace k3 {

// `file` names the source in error messages ("DIR/config.json").
Result<ModelConfig> parse_hf_config(std::string_view json_text, const std::string& file = "config.json");
// Reads and parses a config.json file (Code::not_found when it does not exist).
Result<ModelConfig> load_hf_config(const std::string& path);

}  // namespace k3
