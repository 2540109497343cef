// plan.h: memory per GPU and decode traffic of a model under a multi-GPU layout (`k3 plan`, docs/plan.md).
//
// Weights come from the loader's own manifest (io/manifest: expected_tensors), so the planner and the
// loader cannot disagree: bytes(tensor) = numel(manifest shape) * dtype size, the dtype being the one the
// checkpoint stores (or, from a config alone, the manifest's first allowed dtype; MXFP4 experts when the
// config declares compressed-tensors mxfp4).
//
// Layout (world W = tp * kcp * dp GPUs; ep divides W):
//   tp   tensor parallel as src/dist/tp.h shards: attention heads (KDA projections, conv, dt_bias, A_log;
//        MLA q_b / kv_b / g / o), dense and shared-expert d_ff. Replicated: embedding, lm_head, norms,
//        AttnRes, router, LatentMoE down/up, the low-rank a-projections, the latent projection and the DSA
//        indexer's key path (wk, k_norm); the indexer's head-indexed wq_b / weights_proj split. The MLA
//        latent is one MQA head and the index key one per token: every TP rank holds both whole cache rows.
//   kcp  KDA context parallel: a sequence split over kcp ranks; MLA latent / DSA index rows sharded by
//        position (ceil(T / kcp) each); the fixed KDA state (S, conv window) is held by every kcp rank.
//   dp   trunk replicas; the batch is split over them (ceil(B / dp) sequences each).
//   ep   routed experts split over ep ranks (ceil(E / ep) each); W / ep expert replicas.
//
// Per sequence (MODEL.md §11):  KDA layer  S [H, K, V] (fp32 | bf16) + conv window [3, W-1, H*K]
//                               MLA layer  d_latent = kv_lora_rank + d_rope values per token
//                               DSA layer  d_latent + index d_head values per token
// Cache formats: fp32 = what the CPU engine's SeqState allocates (every value fp32); bf16 = MODEL.md's
// normative storage (ModelConfig::*_bytes_*: fp32 S, bf16 conv / latent / index keys); fp8 = vLLM's
// fp8_ds_mla latent (656 B) and FP8 index key + scale (132 B), conv bf16.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/status.h"
#include "core/tensor.h"
#include "k3/config.h"

namespace k3 {

enum class Shard { replicated, tp, ep };  // how a weight is split over the ranks that hold it
const char* shard_name(Shard s);

struct PlanTensor {
  std::string name;  // canonical manifest name
  int layer = -1;    // -1: model-level
  DType dtype = DType::bf16;
  int64_t bytes = 0;  // numel(shape) * dtype_size(dtype)
  Shard shard = Shard::replicated;
};

// Every tensor of the manifest. `find` may be empty (config only) or return nullptr for an absent name.
std::vector<PlanTensor> plan_tensors(const ModelConfig& c,
                                     const std::function<const TensorView*(const std::string&)>& find);

enum class CacheFormat { fp32, bf16, fp8 };
const char* cache_format_name(CacheFormat f);
bool cache_format_from_name(const std::string& s, CacheFormat* out);

struct SeqCacheBytes {        // one sequence, whole model (no sharding)
  int64_t kda_state = 0;      // fixed: sum over KDA layers of S + conv window
  int64_t mla_per_token = 0;  // latent rows of every MLA and DSA layer, per token
  int64_t dsa_per_token = 0;  // index keys of every DSA layer, per token
  int64_t at(int64_t n_tok) const { return kda_state + n_tok * (mla_per_token + dsa_per_token); }
};
SeqCacheBytes seq_cache_bytes(const ModelConfig& c, CacheFormat f, bool state_bf16);

struct PlanOptions {
  int gpus_per_node = 8;
  int nodes = 1;
  int64_t context = 131072;  // T: tokens per sequence (prompt + generated)
  int64_t batch = 1;         // B: sequences decoded together
  CacheFormat cache = CacheFormat::bf16;
  bool state_bf16 = false;             // KDA S stored in bf16 (a vLLM option; MODEL.md §13 row 15)
  int64_t gpu_mem = 141'000'000'000;   // bytes per GPU (H200: 141 GB)
  int64_t reserve = int64_t(2) << 30;  // CUDA context, library workspaces, allocator slack
  int64_t chunk = 8192;                // prefill tokens per step (workspace)
  int act_bytes = 4;                   // activation element in memory (the engine keeps fp32)
  int wire_bytes = 2;                  // activation element on the wire (bf16)
  double hbm_bytes_per_s = 4.274e12;   // measured H200 copy bandwidth (ANCHORS.md §9)
};

struct Layout {
  int tp = 1, kcp = 1, dp = 1, ep = 1;
  int world() const { return tp * kcp * dp; }
  std::string name() const;  // "TP8xKCP2xEP16" (degree-1 parts left out, "TP1" for one GPU)
};
// "tp8xep16", "TP8,KCP2,EP16", "tp=8 ep=16": parts in any order; ep defaults to the world size.
Result<Layout> parse_layout(const std::string& s);
// Degrees divide heads / d_ff / experts (tp as dist/tp.h's tp_check); tp within a node; world within nodes *
// gpus.
Status check_layout(const ModelConfig& c, const Layout& l, const PlanOptions& o);

struct GpuMemory {  // bytes on the busiest GPU
  int64_t weights_replicated = 0, weights_tp = 0, weights_ep = 0;
  int64_t kda_state = 0, mla_cache = 0, dsa_cache = 0;
  int64_t workspace = 0;
  int64_t weights() const { return weights_replicated + weights_tp + weights_ep; }
  int64_t cache() const { return kda_state + mla_cache + dsa_cache; }
  int64_t total() const { return weights() + cache() + workspace; }
};

struct DecodeTraffic {                // one decode step: one new token for each of B sequences
  double weight_bytes_per_token = 0;  // unique weights read (trunk + distinct experts touched) / B
  double cache_bytes_per_token = 0;   // KDA state + latent / index rows read, per sequence
  double gpu_bytes_per_step = 0;      // weights + cache read by the busiest GPU
  double step_seconds = 0;            // gpu_bytes_per_step / hbm bandwidth (a lower bound)
};

struct LayerComm {        // bytes one GPU sends, per layer of the kind named
  double tp_decode = 0;   // every layer: 2 ring all-reduces of [n, D] (attention out, FFN out)
  double ep_decode = 0;   // MoE layers: all-to-all dispatch + combine of the d_in-wide expert inputs
  double kcp_decode = 0;  // MLA/DSA layers: q broadcast + partial (o, max, sum) of the rank's rows
  double tp_prefill_per_token = 0, ep_prefill_per_token = 0;
  double kcp_prefill_kda = 0;  // KDA layer, one prompt: all-gather of (M, S~) per head + conv halo
  double kcp_prefill_mla = 0;  // MLA/DSA layer, one prompt of T tokens: all-gather of latent (+ index) rows
  // DSA layer under TP: all-reduce of the fp32 index scores, one row of n_ctx <= T per query token
  // (decode: seqs x T x 4 bytes of message; prefill: at most T x 4 per token, n_tok x n_ctx x 4 per chunk)
  double tp_dsa_decode = 0, tp_dsa_prefill_per_token = 0;
};

struct Plan {
  Layout layout;
  GpuMemory mem;
  DecodeTraffic decode;
  LayerComm comm;
  bool fits = false;  // mem.total() <= gpu_mem
};

Plan evaluate_plan(const ModelConfig& c, const std::vector<PlanTensor>& w, const Layout& l,
                   const PlanOptions& o);
// Every layout that passes check_layout on up to nodes * gpus_per_node GPUs (worlds: divisors of a node,
// then whole nodes), evaluated.
std::vector<Plan> all_plans(const ModelConfig& c, const std::vector<PlanTensor>& w, const PlanOptions& o);
// The smallest world that fits; among those, the least bytes per decode step on the busiest GPU, then
// the least TP + EP + KCP traffic, then the least memory. nullopt when nothing fits.
std::optional<Plan> smallest_fit(const std::vector<Plan>& plans);

}  // namespace k3
