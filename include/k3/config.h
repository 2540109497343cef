// config.h: one validated description of a Kimi Linear / K3 / K3.1 text model, parsed from the
// checkpoint's config.json (flat for Kimi Linear, `text_config` nested for K3/K3.1; MODEL.md §1-2).
// Every field below is read from a key MODEL.md lists, or derived from those keys.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace k3 {

enum class Family { kimi_linear, k3, k3_1 };
enum class AttnKind { kda, mla, dsa };      // token mixer of a layer
enum class Activation { silu, situ };       // GLU activation of every MLP
enum class ChatFormat { k2, k3_xtml };      // chosen from the family, never by a flag

const char* family_name(Family f);
const char* attn_kind_name(AttnKind k);

struct KdaConfig {                 // linear_attn_config
  int n_head = 0;                  // num_heads (independent of the MLA head count)
  int d_head = 0;                  // head_dim (K = V)
  int conv_size = 0;               // short_conv_kernel_size (4)
  bool full_rank_gate = false;     // use_full_rank_gate: output gate g_proj [H*K, D] instead of g_a/g_b
  bool has_gate_lower_bound = false;
  float gate_lower_bound = 0.f;    // K3: g = lb * sigmoid(exp(A_log) * z); KL: g = -exp(A_log) softplus(z)
  int gate_rank = 0;               // f_a_proj / g_a_proj rank, derived from the checkpoint (128)
};

struct MlaConfig {
  int n_head = 0;                  // num_attention_heads
  int q_lora_rank = 0;             // 0 = no q-LoRA (KL: q_proj)
  int kv_lora_rank = 0;            // 512
  int d_nope = 0;                  // qk_nope_head_dim 128
  int d_rope = 0;                  // qk_rope_head_dim 64 (not rotated: NoPE)
  int d_v = 0;                     // v_head_dim 128
  bool use_output_gate = false;    // mla_use_output_gate: o *= sigmoid(g_proj x)
  int d_qk() const { return d_nope + d_rope; }       // 192
  int d_latent() const { return kv_lora_rank + d_rope; }  // 576: cache width per token
};

struct DsaConfig {                 // text_config.dsa_config (K3.1); every key required
  bool enabled = false;
  int n_head = 0;                  // index_num_heads 32
  int d_head = 0;                  // index_head_dim 128
  int topk = 0;                    // index_topk 2048
};

struct MoeConfig {
  int n_expert = 0;                // num_experts
  int n_expert_used = 0;           // num_experts_per_token
  int n_shared_expert = 0;         // num_shared_experts (merged into one MLP of width n_shared * d_ff_expert)
  int d_ff_expert = 0;             // moe_intermediate_size
  int d_latent = 0;                // routed_expert_hidden_size (K3: 3584); 0 = experts at full width (KL)
  bool latent_norm = false;        // latent_moe_use_norm
  bool renormalize = true;         // moe_renormalize
  float routed_scaling_factor = 1.f;
  int n_expert_group = 1;          // grouped top-k; only 1/1 is supported (MODEL.md §8.3)
  int topk_group = 1;
  bool experts_mxfp4 = false;      // routed experts stored as compressed-tensors mxfp4-pack-quantized
};

struct ModelConfig {
  Family family = Family::kimi_linear;
  std::string model_type;          // top-level model_type
  int d_model = 0;                 // hidden_size
  int n_layer = 0;                 // num_hidden_layers
  int n_vocab = 0;                 // vocab_size
  float rms_norm_eps = 1e-5f;
  Activation act = Activation::silu;
  float situ_beta = 4.f;           // activation_situ_beta
  bool has_situ_linear_beta = false;
  float situ_linear_beta = 0.f;    // activation_situ_linear_beta (absent: b = u)
  int d_ff = 0;                    // intermediate_size (dense layers)
  int first_k_dense_replace = 0;
  int moe_layer_freq = 1;
  int attn_res_block_size = 0;     // 0 = plain pre-norm residual (KL)
  int bos_id = -1, eos_id = -1, pad_id = -1;

  KdaConfig kda;
  MlaConfig mla;
  DsaConfig dsa;
  MoeConfig moe;

  // Derived, one entry per layer (0-based).
  std::vector<AttnKind> layer_attn;
  std::vector<bool> layer_moe;

  bool uses_attn_res() const { return attn_res_block_size > 0; }
  ChatFormat chat_format() const { return family == Family::kimi_linear ? ChatFormat::k2 : ChatFormat::k3_xtml; }
  // Persistent cache bytes (MODEL.md §11), at fp32 KDA state and bf16 latent / index keys.
  int64_t kda_state_bytes_per_layer() const;     // S [H,K,V] fp32 + conv window [3*H*K, W-1] bf16
  int64_t mla_bytes_per_token_per_layer() const;  // 576 * 2
  int64_t dsa_index_bytes_per_token_per_layer() const;  // 128 * 2 (0 without DSA)
  int n_layers_of(AttnKind k) const;
};

}  // namespace k3
