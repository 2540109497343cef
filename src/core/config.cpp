// config.cpp: the derived quantities of ModelConfig (parsing lives in io/hf_config.cpp).
#include "k3/config.h"

namespace k3 {

const char* family_name(Family f) {
  switch (f) {
    case Family::kimi_linear: return "kimi_linear";
    case Family::k3: return "kimi_k3";
    case Family::k3_1: return "kimi_k3.1";
  }
  return "?";
}

const char* attn_kind_name(AttnKind k) {
  switch (k) {
    case AttnKind::kda: return "KDA";
    case AttnKind::mla: return "MLA";
    case AttnKind::dsa: return "DSA";
  }
  return "?";
}

int64_t ModelConfig::kda_state_bytes_per_layer() const {
  const int64_t H = kda.n_head, K = kda.d_head;
  const int64_t S = H * K * K * 4;                                  // [H, K, V] fp32
  const int64_t conv = 3 * H * K * int64_t(kda.conv_size - 1) * 2;  // q, k, v windows, bf16
  return S + conv;
}

int64_t ModelConfig::mla_bytes_per_token_per_layer() const { return int64_t(mla.d_latent()) * 2; }

int64_t ModelConfig::dsa_index_bytes_per_token_per_layer() const {
  return dsa.enabled ? int64_t(dsa.d_head) * 2 : 0;
}

int ModelConfig::n_layers_of(AttnKind k) const {
  int n = 0;
  for (AttnKind a : layer_attn) n += a == k;
  return n;
}

}  // namespace k3
