// state.h: everything one sequence carries between forward calls (MODEL.md §11).
//
//   KDA layer:  S [H, K, V] fp32 and the conv window [3, W-1, H*K] of pre-conv q~, k~, v~ rows
//   MLA layer:  latent cache [n_past, kv_lora_rank + d_rope] ([c | r], post-norm c)
//   DSA layer:  the MLA latent cache plus index keys [n_past, index_head_dim]
// AttnRes, MoE and norms keep nothing. Values are fp32 in memory; in bf16 mode the cached rows hold
// bf16-representable values. The state is plain data: cloning it forks a sequence.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "k3/config.h"
#include "model/kda.h"
#include "model/mla.h"

namespace k3 {

class SeqState {
 public:
  explicit SeqState(const ModelConfig& cfg);

  int64_t n_past() const { return n_past_; }
  // Back to an empty sequence (zero S and conv windows, empty caches).
  void reset();
  // After a caller filled the buffers itself (a prefix-cache restore: latent rows, index keys, S and conv
  // windows for positions [0, n)), declares how many positions they hold.
  void set_n_past(int64_t n) { n_past_ = n; }
  std::unique_ptr<SeqState> clone() const { return std::make_unique<SeqState>(*this); }
  // Bytes held by the state buffers.
  int64_t bytes() const;

  std::vector<KdaState> kda;  // [n_layer]; empty entries for MLA/DSA layers
  std::vector<MlaState> mla;  // [n_layer]; empty entries for KDA layers

 private:
  friend class Model;
  const ModelConfig* cfg_;
  int64_t n_past_ = 0;
};

}  // namespace k3
