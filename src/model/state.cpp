// state.cpp: per-sequence state (state.h).
#include "model/state.h"

namespace k3 {

SeqState::SeqState(const ModelConfig& cfg) : cfg_(&cfg) {
  reset();
}

void SeqState::reset() {
  n_past_ = 0;
  kda.assign(size_t(cfg_->n_layer), {});
  mla.assign(size_t(cfg_->n_layer), {});
  for (int l = 0; l < cfg_->n_layer; ++l)
    if (cfg_->layer_attn[size_t(l)] == AttnKind::kda) init_kda_state(*cfg_, &kda[size_t(l)]);
}

int64_t SeqState::bytes() const {
  int64_t n = 0;
  for (const KdaState& s : kda) n += int64_t(s.S.size() + s.conv.size()) * 4;
  for (const MlaState& s : mla) n += int64_t(s.latent.size() + s.index_k.size()) * 4;
  return n;
}

}  // namespace k3
