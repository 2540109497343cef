// model.h: the exact CPU forward pass of Kimi Linear, K3 and K3.1 (MODEL.md), over explicit per-sequence
// state.
//
//   x0 = embed_tokens[id]
//   KL:       per layer  h = x + Attn(RMSNorm_in(x));  x = h + FFN(RMSNorm_post(h))
//   K3/K3.1:  per layer  the same sub-layers, residual adds replaced by Block AttnRes (attn_res.h)
//   logits = lm_head RMSNorm(final; model.norm)            fp32, [n_tok or 1, n_vocab]
// Attn is KDA (kda.h), MLA or DSA (mla.h); FFN is the dense GLU (ffn.h) or MoE (moe.h).
//
// Paths: KDA chunkwise (chunk kda_chunk) for multi-token calls, recurrent for one token or when forced;
// MLA unabsorbed (per-head K/V expanded from the latent cache) for multi-token calls, absorbed (MQA over the
// 576-wide latent) for one token, unless ModelOptions::mla forces one. Every path continues exactly from
// SeqState, so one-shot prefill, chunked prefill and token-by-token decode agree.
// The Model keeps views into the Checkpoint: the Checkpoint must outlive it. A Model runs one forward
// call at a time (it owns one thread pool); SeqStates are independent.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <vector>

#include "core/status.h"
#include "io/checkpoint.h"
#include "k3/config.h"
#include "model/state.h"
#include "ops/precision.h"

namespace k3 {

class ThreadPool;
class ParallelHooks;
struct ModelWeights;

enum class MlaPath {
  auto_,
  unabsorbed,
  absorbed
};  // auto_: unabsorbed for multi-token calls, absorbed for 1

struct ModelOptions {
  Precision precision = Precision::fp32;
  int n_threads = 0;  // <= 0: hardware concurrency
  MlaPath mla = MlaPath::auto_;
  int kda_chunk = 64;
  bool kda_recurrent = false;  // force token-by-token KDA
  // Named intermediates per layer ("attn_norm", "kda_o", "ffn_out", ...; layer n_layer = the final norm).
  std::function<void(const char* name, int layer, const float* data, int64_t n)> trace;
  ParallelHooks* parallel = nullptr;  // this rank's parallel layout (model/parallel.h); nullptr: one rank
  bool cuda_graph = false;  // GpuModel only: decode steps as CUDA graphs (opt-in, gpu/model_gpu.h; or
                            // K3_CUDA_GRAPH=1); the CPU ignores it
};

// Applied once after binding (src/dist: tensor / expert sharding): may shrink the config copy the Model
// keeps (heads per rank) and the weights (slices); shard copies go into ModelWeights::shard_storage.
using WeightTransform = std::function<Status(ModelConfig& cfg, ModelWeights& w)>;

class Model {
 public:
  static Result<std::unique_ptr<Model>> load(const Checkpoint& ckpt, const ModelOptions& opt);
  static Result<std::unique_ptr<Model>> load(const Checkpoint& ckpt, const ModelOptions& opt,
                                             const WeightTransform& shard);
  ~Model();

  // True in debug builds (NDEBUG unset): every traced activation is checked for NaN/Inf.
  static bool activation_checks_enabled();

  const ModelConfig& config() const { return cfg_; }
  const ModelOptions& options() const { return opt_; }
  std::unique_ptr<SeqState> new_state() const;

  // Appends tokens to the sequence, continuing exactly from `state`. logits: [n_tok, n_vocab] when
  // all_logits, else [1, n_vocab] for the last token. A bad token id gives a Status and leaves `state`
  // unchanged; in debug builds a non-finite activation gives a Status naming layer and tensor (the state
  // is then unusable: reset it).
  Status forward(SeqState& state, const int32_t* tokens, int64_t n_tok, std::vector<float>* logits,
                 bool all_logits);
  // Several sequences in one call (each with its own state and token span); last_logits[i]: [n_vocab].
  Status forward_batch(std::span<SeqState*> states, std::span<const std::span<const int32_t>> tokens,
                       std::vector<std::vector<float>>* last_logits);
  // Packed call: sequence i owns rows [row0[i], row0[i+1]) of `tokens` (no empty sequence); logits
  // [out_rows.size(), n_vocab] of the listed rows (ascending).
  Status forward_packed(std::span<SeqState* const> states, const int32_t* tokens,
                        std::span<const int64_t> row0, std::span<const int64_t> out_rows,
                        std::vector<float>* logits);

 private:
  Model(const Checkpoint& ckpt, const ModelOptions& opt, std::unique_ptr<ModelConfig> shard_cfg = nullptr);
  // The batched layer loop: sequence i owns rows [row0[i], row0[i+1]) of `tokens`. Writes logits of the
  // rows listed in `out_rows` (ascending) into logits [out_rows.size(), n_vocab].
  Status run(std::span<SeqState* const> states, const int32_t* tokens, std::span<const int64_t> row0,
             std::span<const int64_t> out_rows, float* logits);
  std::unique_ptr<ModelConfig> shard_cfg_;  // a rank's share of the config (WeightTransform), if any
  const ModelConfig& cfg_;                  // *shard_cfg_ or the checkpoint's
  ModelOptions opt_;
  std::unique_ptr<ModelWeights> w_;
  std::unique_ptr<ThreadPool> pool_;
};

}  // namespace k3
